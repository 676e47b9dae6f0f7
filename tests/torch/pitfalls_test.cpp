// ddp::torch and the pitfalls of docs/pitfalls.md: the patterns that fail in PyTorch's DDP give
// ddp's named errors on every rank, naming the torch parameter or buffer; readiness comes from
// autograd; gradients live in the trainer's memory.
#include "torch/torch_model.hpp"
#include "torch/doctest.hpp"

#include "ddp/ddp.hpp"
#include "ddp/host/device.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/torch/module.hpp"
#include "support/on_ranks.hpp"
#include "support/relative_error.hpp"

namespace torch_pitfalls_test {

namespace {

const ddp::optim::sgd sgd{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-2f};

using test::contains;

// Every rank's error ("" for a rank that returned).
template <class F>
std::vector<std::string> errors_on_ranks(int world, F fn) {
  return test::on_ranks(world, fn).errors;
}

// MoCo's pattern: logits against a queue of keys kept in a buffer, read by matmul (so autograd
// saves it for backward).
struct queue_netImpl : torch::nn::Module {
  queue_netImpl()
      : fc(register_module("fc", torch::nn::Linear(torch_test::in_features, 4))),
        queue(register_buffer("queue", torch::randn({5, 4}))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::matmul(fc(x), queue.t()); }
  torch::nn::Linear fc;
  torch::Tensor queue;
};
TORCH_MODULE(queue_net);

queue_net make_queue_net(std::uint64_t seed) {
  return ddp::torch::build_seeded(seed, [] { return queue_net(); });
}

// Two forwards, then their backwards innermost first: the second forward's buffer sync writes the
// queue the first forward's backward reads.
template <class Sync>
void two_forwards_on_a_queue(ddp::inproc::communicator& comm) {
  ddp::torch::module model(make_queue_net(1 + static_cast<std::uint64_t>(comm.rank())));
  ddp::host::device dev;
  ddp::trainer<decltype(model), Sync> trainer(model, comm, dev, sgd);
  const auto b = torch_test::make_batch(8, 7 + static_cast<std::uint64_t>(comm.rank()));
  const auto y = b.y.remainder(5);
  trainer.step([&](auto& r) {
    auto first = torch::nn::functional::cross_entropy(r.forward(b.x.slice(0, 0, 4)), y.slice(0, 0, 4));
    auto second = torch::nn::functional::cross_entropy(r.forward(b.x.slice(0, 4, 8)), y.slice(0, 4, 8));
    r.backward(second);
    r.backward(first);
  });
}

// The net with fc1 frozen, as a fine-tuning run keeps a pretrained layer.
torch_test::net frozen_fc1(torch_test::net n) {
  n->fc1->weight.set_requires_grad(false);
  n->fc1->bias.set_requires_grad(false);
  return n;
}

}  // namespace

TEST_CASE("P1 (torch): a queue buffer overwritten between two forwards is ddp's error naming it, on every rank") {
  torch::set_num_threads(1);
  const auto errors = errors_on_ranks(2, two_forwards_on_a_queue<ddp::buffer_sync::broadcast_each_forward>);
  for (const auto& e : errors) {
    CAPTURE(e);
    CHECK(contains(e, "buffer 'queue' was overwritten by the trainer's buffer synchronisation"));
    CHECK(contains(e, "pitfall P1"));
    CHECK(contains(e, "modified by an inplace operation"));  // torch's own words, kept
    CHECK(contains(e, "broadcast_once_per_step"));
  }
}

TEST_CASE("P1 (torch): the same two forwards train with broadcast_once_per_step") {
  torch::set_num_threads(1);
  for (const auto& e : errors_on_ranks(2, two_forwards_on_a_queue<ddp::buffer_sync::broadcast_once_per_step>))
    CHECK(e.empty());
}

TEST_CASE("P2 (torch): a branch unused on one rank is one error on every rank, naming its parameters") {
  torch::set_num_threads(1);
  const auto errors = errors_on_ranks(3, [](ddp::inproc::communicator& comm) {
    ddp::torch::module model(torch_test::make_net(5));
    ddp::host::device dev;
    ddp::trainer<decltype(model)> trainer(model, comm, dev, sgd);
    model.net()->use_aux = comm.rank() != 1;
    const auto b = torch_test::make_batch(6, 20 + static_cast<std::uint64_t>(comm.rank()));
    trainer.step([&](auto& r) { r.backward(torch::nn::functional::cross_entropy(r.forward(b.x), b.y)); });
  });
  for (const auto& e : errors) {
    CAPTURE(e);
    CHECK(contains(e, "'aux.weight' (no gradient on rank(s) 1)"));
    CHECK(contains(e, "'aux.bias' (no gradient on rank(s) 1)"));
    CHECK(contains(e, "pitfall P2"));
  }
}

TEST_CASE("P2 (torch): detect_each_step trains the same branchy net, the unused branch left alone") {
  torch::set_num_threads(1);
  const auto errors = errors_on_ranks(3, [](ddp::inproc::communicator& comm) {
    ddp::torch::module model(torch_test::make_net(5));
    ddp::host::device dev;
    ddp::trainer<decltype(model), ddp::unused_params::detect_each_step> trainer(model, comm, dev, sgd);
    model.net()->use_aux = false;  // on every rank: aux gets no gradient, and no update
    const auto before = model.net()->aux->weight.clone();
    const auto b = torch_test::make_batch(6, 20 + static_cast<std::uint64_t>(comm.rank()));
    trainer.step([&](auto& r) { r.backward(torch::nn::functional::cross_entropy(r.forward(b.x), b.y)); });
    CHECK(torch::equal(model.net()->aux->weight, before));
    CHECK(trainer.skipped_parameters() == std::vector<std::string>{"aux.weight", "aux.bias"});
  });
  for (const auto& e : errors) CHECK(e.empty());
}

TEST_CASE("P5 (torch): a different layer on one rank fails on every rank, naming the torch parameter") {
  torch::set_num_threads(1);
  const auto errors = errors_on_ranks(3, [](ddp::inproc::communicator& comm) {
    ddp::torch::module model(torch_test::make_net(5, /*with_aux=*/comm.rank() != 2));
    ddp::host::device dev;
    ddp::trainer<decltype(model)> trainer(model, comm, dev, sgd);
  });
  for (const auto& e : errors) {
    CAPTURE(e);
    CHECK(contains(e, "pitfall P5"));
    CHECK(contains(e, "'aux.weight'"));
  }
}

TEST_CASE("frozen parameters (torch) are left out: the rest fine-tunes as one process on the global batch, and "
          "unfreezing one after the module was made is an error naming it") {
  torch::set_num_threads(1);
  constexpr int steps = 3;
  constexpr std::int64_t per_rank = 6;
  auto one = frozen_fc1(torch_test::make_net(5));
  const auto fc1_before = one->fc1->weight.clone();
  std::vector<torch::Tensor> trained;
  for (auto& p : one->parameters())
    if (p.requires_grad()) trained.push_back(p);
  torch::optim::SGD opt(trained, torch::optim::SGDOptions(sgd.lr).momentum(sgd.momentum).weight_decay(sgd.weight_decay));
  for (int s = 0; s < steps; ++s) {
    const auto b = torch_test::make_batch(2 * per_rank, 40 + static_cast<std::uint64_t>(s));
    opt.zero_grad();
    torch::nn::functional::cross_entropy(one->forward(b.x), b.y).backward();
    opt.step();
  }
  CHECK(torch::equal(one->fc1->weight, fc1_before));
  const auto reference = torch_test::values(one);

  const auto ranks = ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) {
    auto net = frozen_fc1(torch_test::make_net(5));
    ddp::torch::module model(net);
    CHECK(model.parameters().size() == 6);  // fc1's two are not the trainer's
    ddp::host::device dev;
    ddp::trainer<decltype(model)> trainer(model, comm, dev, sgd);
    for (int s = 0; s < steps; ++s) {
      const auto b = torch_test::make_batch(2 * per_rank, 40 + static_cast<std::uint64_t>(s));
      const auto x = b.x.slice(0, comm.rank() * per_rank, (comm.rank() + 1) * per_rank);
      const auto y = b.y.slice(0, comm.rank() * per_rank, (comm.rank() + 1) * per_rank);
      trainer.step([&](auto& r) { r.backward(torch::nn::functional::cross_entropy(r.forward(x), y)); });
    }
    return torch_test::values(net);
  });
  for (const auto& r : ranks) CHECK(test::max_relative_error(r, reference) <= 1e-5);

  const auto errors = errors_on_ranks(2, [](ddp::inproc::communicator& comm) {
    auto net = frozen_fc1(torch_test::make_net(5));
    ddp::torch::module model(net);
    ddp::host::device dev;
    ddp::trainer<decltype(model)> trainer(model, comm, dev, sgd);
    net->fc1->weight.set_requires_grad(true);
    const auto b = torch_test::make_batch(per_rank, 9);
    trainer.step([&](auto& r) { r.backward(torch::nn::functional::cross_entropy(r.forward(b.x), b.y)); });
  });
  for (const auto& e : errors) {
    CAPTURE(e);
    CHECK(contains(e, "parameter 'fc1.weight' did not require a gradient when the ddp::torch::module was made"));
  }
}

TEST_CASE("a ddp error thrown from an autograd hook ends the module's backward: later backwards report to no one") {
  torch::set_num_threads(1);
  ddp::torch::module model(torch_test::make_net(5));
  const auto b = torch_test::make_batch(4, 3);
  int reports = 0;
  auto throwing = [&](std::size_t) {
    ++reports;
    throw ddp::error("test", "ready", 0, "a failure inside backward");
  };
  ddp::ready_sink sink(throwing);  // alive throughout: a call after the failed backward would count
  CHECK_THROWS_WITH_AS(model.backward(torch::nn::functional::cross_entropy(model.forward(b.x), b.y), sink),
                       doctest::Contains("a failure inside backward"), ddp::error);
  CHECK(reports == 1);
  torch::nn::functional::cross_entropy(model.net()->forward(b.x), b.y).backward();  // plain libtorch
  CHECK(reports == 1);
}

TEST_CASE("readiness comes from autograd after accumulation, and gradients live in the trainer's buckets") {
  torch::set_num_threads(1);
  ddp::inproc::launch(1, [](ddp::inproc::communicator& comm) {
    ddp::torch::module model(torch_test::make_net(5));
    const auto names = [&] {
      std::vector<std::string> n;
      for (const auto& p : model.parameters()) n.push_back(p.name);
      return n;
    }();
    CHECK(names == std::vector<std::string>{"fc1.weight", "fc1.bias", "track.weight", "track.bias", "head.weight",
                                            "head.bias", "aux.weight", "aux.bias"});
    CHECK(model.buffers().at(0).name == "track.running_mean");

    // Outside a trainer: each parameter reports ready once per backward, with its gradient final.
    const auto b = torch_test::make_batch(4, 3);
    std::vector<std::pair<std::size_t, bool>> reports;
    auto params = model.net()->parameters();
    auto sink_fn = [&](std::size_t i) { reports.push_back({i, params[i].grad().defined() && params[i].grad().abs().sum().item<float>() > 0}); };
    ddp::ready_sink sink(sink_fn);
    model.backward(torch::nn::functional::cross_entropy(model.forward(b.x), b.y), sink);
    REQUIRE(reports.size() == 8);
    for (const auto& [i, has_gradient] : reports) CHECK(has_gradient);
    CHECK(reports.front().first >= 4);  // the head's parameters finish before fc1's

    // In a trainer: .grad() is a view of the trainer's memory, so the trainer's zeroing shows.
    ddp::host::device dev;
    ddp::trainer<decltype(model)> trainer(model, comm, dev, sgd);
    for (const auto& p : model.parameters()) CHECK(p.grad.data == model.net()->named_parameters()[p.name].grad().data_ptr());
    trainer.step([&](auto& r) { r.backward(torch::nn::functional::cross_entropy(r.forward(b.x), b.y)); });
    for (auto& p : model.net()->parameters()) CHECK(p.grad().abs().sum().item<float>() == 0.0f);
    // A zero_grad that sets gradients to None is undone at the next forward.
    for (auto& p : model.net()->parameters()) p.mutable_grad() = torch::Tensor();
    trainer.step([&](auto& r) { r.backward(torch::nn::functional::cross_entropy(r.forward(b.x), b.y)); });
    for (auto& p : model.net()->parameters()) CHECK(p.grad().defined());
  });
}

}  // namespace torch_pitfalls_test
