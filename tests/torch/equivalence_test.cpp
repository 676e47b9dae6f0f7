// ddp::torch against single-process libtorch on the global batch: worlds 1-4, every BufferSync x
// UnusedParamDetection combination, the user's own loss through autograd.
#include "torch/doctest.hpp"

#include "ddp/ddp.hpp"
#include "ddp/host/device.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/torch/module.hpp"
#include "support/relative_error.hpp"
#include "torch/torch_model.hpp"

namespace torch_equivalence_test {

namespace {

constexpr std::int64_t per_rank_batch = 8;
constexpr int steps = 3;
constexpr double lr = 0.1, momentum = 0.9, weight_decay = 1e-3;

// Plain libtorch, one process, the global batch: what a ddp::torch run must equal.
std::vector<std::vector<float>> reference(int world) {
  auto n = torch_test::make_net(3);
  torch::optim::SGD opt(n->parameters(), torch::optim::SGDOptions(lr).momentum(momentum).weight_decay(weight_decay));
  for (int s = 0; s < steps; ++s) {
    auto b = torch_test::make_batch(per_rank_batch * world, 100 + s);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(n->forward(b.x), b.y).backward();
    opt.step();
  }
  return torch_test::values(n);
}

// Step s: this rank's rows of the global batch the reference takes whole, the user's loss.
template <class Trainer>
void step_on_this_ranks_rows(Trainer& trainer, const ddp::inproc::communicator& comm, int s) {
  const auto global = torch_test::make_batch(per_rank_batch * comm.size(), 100 + s);
  const auto r = comm.rank();
  const auto x = global.x.slice(0, r * per_rank_batch, (r + 1) * per_rank_batch);
  const auto y = global.y.slice(0, r * per_rank_batch, (r + 1) * per_rank_batch);
  trainer.step([&](auto& replica) { replica.backward(torch::nn::functional::cross_entropy(replica.forward(x), y)); });
}

template <class Sync, class Unused>
std::vector<std::vector<float>> rank(ddp::inproc::communicator& comm) {
  auto n = torch_test::make_net(3 + static_cast<std::uint64_t>(comm.rank()));  // rank 0's weights win
  ddp::torch::module model(n);
  ddp::host::device dev;
  ddp::trainer<decltype(model), Sync, Unused, ddp::bucket_cap<256>> trainer(
      model, comm, dev,
      ddp::optim::sgd{.lr = float(lr), .momentum = float(momentum), .weight_decay = float(weight_decay),
                      .nesterov = false});
  for (int s = 0; s < steps; ++s) step_on_this_ranks_rows(trainer, comm, s);
  return torch_test::values(n);
}

template <class Sync, class Unused>
void check_every_world() {
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    const auto ref = reference(world);
    for (const auto& r : ddp::inproc::launch(world, [](auto& comm) { return rank<Sync, Unused>(comm); }))
      CHECK(test::max_relative_error(r, ref) <= 1e-5);
  }
}

template <class Sync>
void with_every_unused_policy() {
  SUBCASE("forbid") { check_every_world<Sync, ddp::unused_params::forbid>(); }
  SUBCASE("detect_each_step") { check_every_world<Sync, ddp::unused_params::detect_each_step>(); }
  SUBCASE("static_graph") { check_every_world<Sync, ddp::unused_params::static_graph>(); }
  SUBCASE("unchecked") { check_every_world<Sync, ddp::unused_params::unchecked>(); }
}

}  // namespace

TEST_CASE("ddp::torch equals one libtorch process on the global batch, every policy pair, worlds 1-4") {
  torch::set_num_threads(1);
  SUBCASE("buffer_sync::none") { with_every_unused_policy<ddp::buffer_sync::none>(); }
  SUBCASE("buffer_sync::broadcast_each_forward") { with_every_unused_policy<ddp::buffer_sync::broadcast_each_forward>(); }
  SUBCASE("buffer_sync::broadcast_once_per_step") { with_every_unused_policy<ddp::buffer_sync::broadcast_once_per_step>(); }
  SUBCASE("buffer_sync::average_once_per_step") { with_every_unused_policy<ddp::buffer_sync::average_once_per_step>(); }
}

TEST_CASE("optim::external: the trainer reduces, a torch::optim optimizer steps, equal to one process") {
  torch::set_num_threads(1);
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    const auto ref = reference(world);
    const auto ranks = ddp::inproc::launch(world, [](ddp::inproc::communicator& comm) {
      auto n = torch_test::make_net(3 + static_cast<std::uint64_t>(comm.rank()));
      ddp::torch::module model(n);
      ddp::host::device dev;
      ddp::trainer<decltype(model), ddp::optim::external> trainer(model, comm, dev);
      torch::optim::SGD opt(n->parameters(),
                            torch::optim::SGDOptions(lr).momentum(momentum).weight_decay(weight_decay));
      for (int s = 0; s < steps; ++s) {
        step_on_this_ranks_rows(trainer, comm, s);
        opt.step();  // on the averaged gradients the trainer left in .grad()
        opt.zero_grad();
      }
      return torch_test::values(n);
    });
    for (const auto& r : ranks) CHECK(test::max_relative_error(r, ref) <= 1e-5);
  }
}

}  // namespace torch_equivalence_test
