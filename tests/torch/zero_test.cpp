// ddp::torch under the update strategies that keep only a shard: update::sharded_gradients on any
// net (gradients placed as autograd accumulates them), update::fully_sharded on a
// torch::nn::Sequential (values placed layer by layer, through the same storage objects autograd
// saved in forward). Each gives update::replicated's bits.
#include "torch/doctest.hpp"
#include "torch/torch_model.hpp"

#include "ddp/ddp.hpp"
#include "ddp/host/device.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/torch/module.hpp"

namespace torch_zero_test {

namespace {

constexpr std::int64_t per_rank_batch = 8;
constexpr int steps = 4;
const ddp::optim::adamw adamw{.lr = 0.01f, .weight_decay = 0.01f};

using values_t = std::vector<std::vector<float>>;

// The memory test's tower: 40 linear layers of 64 x 64, a bucket each.
constexpr int tower_layers = 40;
constexpr std::int64_t tower_width = 64;

// Four layers with parameters (batch norm among them) and two without, so that the bucket cap
// below makes buckets of a layer or two.
torch::nn::Sequential make_sequential(std::uint64_t seed) {
  return ddp::torch::build_seeded(seed, [] {
    return torch::nn::Sequential(torch::nn::Linear(torch_test::in_features, 16), torch::nn::ReLU(),
                                 torch::nn::BatchNorm1d(16), torch::nn::Linear(16, 16), torch::nn::Tanh(),
                                 torch::nn::Linear(16, torch_test::classes));
  });
}

// A layer with parameters whose output is not a tensor: an LSTM over a sequence of one step.
struct as_sequenceImpl : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor& x) { return x.unsqueeze(0); }
};
TORCH_MODULE(as_sequence);
struct last_outputImpl : torch::nn::Module {
  torch::Tensor forward(const std::tuple<torch::Tensor, std::tuple<torch::Tensor, torch::Tensor>>& out) {
    return std::get<0>(out).squeeze(0);
  }
};
TORCH_MODULE(last_output);

torch::nn::Sequential make_recurrent(std::uint64_t seed) {
  return ddp::torch::build_seeded(seed, [] {
    return torch::nn::Sequential(as_sequence(), torch::nn::LSTM(torch_test::in_features, 8), last_output(),
                                 torch::nn::Linear(8, torch_test::classes));
  });
}

struct run {
  values_t trained;    // the net's parameters after the trainer is gone
  values_t evaluated;  // the net in eval mode on a batch, through the trainer's module, between steps
  bool held_values_between_steps = true;
  bool held_gradients_between_steps = true;
  bool alias_follows = false;  // w.detach(), taken before the trainer, holds the trained values after it
};

// `micro`: each step is two micro-batches of half the rank's rows.
template <class Update, class Net>
run train(ddp::inproc::communicator& comm, Net net, bool micro) {
  ddp::torch::module model(net);
  ddp::host::device dev;
  run out;
  const auto alias = net->parameters().back().detach();
  {
    ddp::trainer<decltype(model), Update, ddp::optim::adamw, ddp::bucket_cap<1024>> trainer(model, comm, dev, adamw);
    for (int s = 0; s < steps; ++s) {
      const auto global = torch_test::make_batch(per_rank_batch * comm.size(), 100 + s);
      const auto rows = [&](std::int64_t from, std::int64_t n) {
        return std::pair{global.x.slice(0, from, from + n), global.y.slice(0, from, from + n)};
      };
      const auto loss_on = [](auto part) {
        return [part](auto& replica) {
          replica.backward(torch::nn::functional::cross_entropy(replica.forward(part.first), part.second));
        };
      };
      const std::int64_t first = comm.rank() * per_rank_batch;
      if (micro) {
        trainer.accumulate(loss_on(rows(first, per_rank_batch / 2)));
        trainer.step(loss_on(rows(first + per_rank_batch / 2, per_rank_batch / 2)));
      } else {
        trainer.step(loss_on(rows(first, per_rank_batch)));
      }
      for (auto& p : net->parameters()) {
        out.held_values_between_steps = out.held_values_between_steps && p.storage().data() != nullptr;
        out.held_gradients_between_steps = out.held_gradients_between_steps && p.grad().defined();
      }
    }
    model.eval();  // a forward on every rank: under fully_sharded it gathers layer by layer
    out.evaluated.push_back(torch_test::floats(model.forward(torch_test::make_batch(5, 7).x)));
    model.train();
    trainer.gather_parameters();  // update::fully_sharded: the net keeps what is gathered when the trainer goes
  }
  out.trained = torch_test::values(net);
  const auto& last = net->parameters().back();
  out.alias_follows = alias.storage().data() == last.storage().data() && torch_test::floats(alias) == out.trained.back();
  return out;
}

// `make(seed)` builds the net each rank trains.
template <class Update, class Make = decltype(&make_sequential)>
std::vector<run> on_ranks(int world, bool micro, Make make = make_sequential) {
  return ddp::inproc::launch(world, [micro, make](ddp::inproc::communicator& comm) {
    return train<Update>(comm, make(3), micro);
  });
}

// Update's runs at as many ranks as `replicated` (the same nets under update::replicated): every
// rank trains and evaluates to replicated's bits. Returned for the strategy's own checks.
template <class Update, class Make = decltype(&make_sequential)>
std::vector<run> same_bits_as(const std::vector<run>& replicated, bool micro, Make make = make_sequential) {
  const auto runs = on_ranks<Update>(static_cast<int>(replicated.size()), micro, make);
  for (std::size_t r = 0; r < runs.size(); ++r) {
    CAPTURE(r);
    CHECK(runs[r].trained == replicated[r].trained);
    CHECK(runs[r].evaluated == replicated[r].evaluated);
  }
  return runs;
}

}  // namespace

TEST_CASE("ddp::torch over a torch::nn::Sequential: sharded, sharded_gradients and fully_sharded give replicated's "
          "bits, worlds 1-3, with micro-batches, the net holding only its shard between steps") {
  torch::set_num_threads(1);
  for (int world : {1, 2, 3})
    for (bool micro : {false, true}) {
      CAPTURE(world);
      CAPTURE(micro);
      const auto replicated = on_ranks<ddp::update::replicated>(world, micro);
      const auto sharded = same_bits_as<ddp::update::sharded>(replicated, micro);
      const auto zero2 = same_bits_as<ddp::update::sharded_gradients>(replicated, micro);
      const auto zero3 = same_bits_as<ddp::update::fully_sharded>(replicated, micro);
      for (int r = 0; r < world; ++r) {
        CAPTURE(r);
        CHECK(replicated[r].trained == replicated[0].trained);
        CHECK(replicated[r].held_gradients_between_steps);
        CHECK_FALSE(zero2[r].held_gradients_between_steps);
        CHECK(zero2[r].held_values_between_steps);
        CHECK_FALSE(zero3[r].held_gradients_between_steps);
        CHECK_FALSE(zero3[r].held_values_between_steps);
        for (const auto* u : {&replicated[r], &sharded[r], &zero2[r], &zero3[r]}) CHECK(u->alias_follows);
      }
    }
}

TEST_CASE("ddp::torch over a Sequential with a layer whose output is not a tensor (an LSTM): each strategy gives "
          "replicated's bits") {
  torch::set_num_threads(1);
  for (int world : {1, 2}) {
    CAPTURE(world);
    const auto replicated = on_ranks<ddp::update::replicated>(world, true, make_recurrent);
    same_bits_as<ddp::update::sharded_gradients>(replicated, true, make_recurrent);
    for (const auto& zero3 : same_bits_as<ddp::update::fully_sharded>(replicated, true, make_recurrent))
      CHECK_FALSE(zero3.held_values_between_steps);
  }
}

TEST_CASE("ddp::torch: update::sharded_gradients on a net of its own forward (not a Sequential) gives replicated's "
          "bits") {
  torch::set_num_threads(1);
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    const auto make_net = [](std::uint64_t seed) { return torch_test::make_net(seed); };
    const auto replicated = on_ranks<ddp::update::replicated>(world, true, make_net);
    for (const auto& zero2 : same_bits_as<ddp::update::sharded_gradients>(replicated, true, make_net))
      CHECK_FALSE(zero2.held_gradients_between_steps);
  }
}

TEST_CASE("ddp::torch update::fully_sharded at world 4: a 40-layer Sequential's parameters, gradients and AdamW "
          "state peak at most 0.35 of update::replicated's, the net holding none between steps") {
  torch::set_num_threads(1);
  constexpr int world = 4;
  struct measured {
    std::size_t peak = 0, module_floats = 0, parameter_floats = 0;
  };
  const auto run = []<class Update>(Update) {
    return ddp::inproc::launch(world, [](ddp::inproc::communicator& comm) {
      auto net = ddp::torch::build_seeded(9, [] {
        torch::nn::Sequential tower;
        for (int k = 0; k < tower_layers; ++k) tower->push_back(torch::nn::Linear(tower_width, tower_width));
        return tower;
      });
      ddp::torch::module model(net);
      ddp::host::device dev;
      measured m;
      for (const auto& p : net->parameters()) m.parameter_floats += static_cast<std::size_t>(p.numel());
      ddp::trainer<decltype(model), Update, ddp::optim::adamw, ddp::bucket_cap<(tower_width + 1) * tower_width * 4>> trainer(
          model, comm, dev, adamw);
      dev.reset_memory_high_water();
      const auto x = torch::rand({2, tower_width});
      const auto y = torch::tensor(std::vector<std::int64_t>{1, 2});
      trainer.step([&](auto& r) { r.backward(torch::nn::functional::cross_entropy(r.forward(x), y)); });
      // Everything the trainer held at its high-water mark, and what the net keeps itself: under
      // replicated its values (its gradients are views of the buckets), under fully_sharded nothing.
      m.peak = dev.memory_high_water();
      for (const auto& p : net->parameters())
        m.module_floats += static_cast<std::size_t>((p.storage().data() ? p.numel() : 0) + (p.grad().defined() ? p.numel() : 0));
      if (std::is_same_v<Update, ddp::update::replicated>) m.peak += m.parameter_floats * sizeof(float);
      trainer.gather_parameters();
      return m;
    })[0];
  };
  const auto rep = run(ddp::update::replicated{});
  const auto zero3 = run(ddp::update::fully_sharded{});
  CHECK(zero3.module_floats == 0);
  CHECK(rep.module_floats == 2 * rep.parameter_floats);  // values, and gradients bound into the buckets
  CHECK(rep.peak >= 4 * rep.parameter_floats * sizeof(float));
  const double ratio = static_cast<double>(zero3.peak) / static_cast<double>(rep.peak);
  MESSAGE("ddp::torch fully_sharded peak / replicated peak at world 4: " << ratio);
  CHECK(ratio <= 0.35);
}

}  // namespace torch_zero_test
