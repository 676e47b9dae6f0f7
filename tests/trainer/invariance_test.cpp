// reduction::invariant<V>: the same bits at every world size. The global batch is V virtual
// shards, each rank runs its shards as micro-batches, and after K steps the parameters and the
// optimizer's effect are bitwise equal at 1, 2, 3, 4, 6 and 8 ranks (3 and 6 do not divide V),
// replicated and sharded, with SGD-momentum and AdamW; the plain reduction, run the same way,
// is not (the check can fail).
#include <doctest/doctest.h>

#include <unistd.h>

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <vector>

#include "ddp/data/loader.hpp"
#include "ddp/inproc/launch.hpp"
#include "support/on_ranks.hpp"
#include "support/relative_error.hpp"
#include "trainer/invariance.hpp"

namespace trainer_invariance_test {

namespace {

using namespace invariance;

template <class Update, class Optimizer>
void check_invariance(Optimizer opt) {
  using invariant = ddp::reduction::invariant<shards>;
  const auto reference = train<invariant, Update>(1, opt)[0];
  // The exact sum is the plain one's to rounding, and training moved the parameters.
  const auto plain = train<ddp::reduction::plain, Update>(1, opt)[0];
  CHECK(test::max_relative_error({reference}, {plain}) <= 1e-5);
  CHECK(test::max_relative_error({reference}, {parameters_of(*std::make_unique<test::mlp>(test::make_mlp(7)))}) > 1e-2);
  for (int world : {2, 3, 4, 6, 8}) {
    CAPTURE(world);
    // fully_sharded gathers in every micro-batch: only a world that deals the shards evenly.
    if (ddp::update::shards_parameters<Update>() && shards % static_cast<std::size_t>(world) != 0) {
      CHECK_THROWS_WITH((train<invariant, Update>(world, opt)), doctest::Contains("run on a world size that divides"));
      continue;
    }
    const auto ranks = train<invariant, Update>(world, opt);
    for (const auto& rank : ranks) CHECK(bitwise_equal(rank, reference));
  }
}

// Model trained under invariant<shards> at 1 rank and at each of `worlds`: every rank holds the
// 1-rank run's bits, and the run moved the parameters from `fresh` (the model train() starts from).
template <class Model, class Update = ddp::update::replicated, class Optimizer>
void check_same_bits(Optimizer opt, Model fresh, std::initializer_list<int> worlds) {
  using invariant = ddp::reduction::invariant<shards>;
  const auto reference = train<invariant, Update, Model>(1, opt)[0];
  CHECK(!bitwise_equal(reference, parameters_of(fresh)));
  for (int world : worlds) {
    CAPTURE(world);
    for (const auto& rank : train<invariant, Update, Model>(world, opt)) CHECK(bitwise_equal(rank, reference));
  }
}

}  // namespace

TEST_CASE_TEMPLATE("reduction::invariant: the same parameter bits at 1, 2, 3, 4, 6 and 8 ranks (fully_sharded: those "
                   "that divide the 8 shards)", Update,
                   ddp::update::replicated, ddp::update::sharded, ddp::update::sharded_gradients,
                   ddp::update::fully_sharded) {
  SUBCASE("sgd with momentum") {
    check_invariance<Update>(ddp::optim::sgd{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-3f});
  }
  SUBCASE("adamw") { check_invariance<Update>(ddp::optim::adamw{.lr = 0.01f}); }
}

TEST_CASE("reduction::invariant with gradient clipping: the norm is exact, the same bits at every world size, "
          "replicated or sharded") {
  const ddp::optim::sgd opt{.lr = 0.1f, .momentum = 0.9f};
  using invariant = ddp::reduction::invariant<shards>;
  run_options clipped;
  clipped.max_norm = 0.05f;
  const auto reference = train<invariant, ddp::update::replicated>(1, opt, clipped)[0];
  CHECK(!bitwise_equal(reference, train<invariant, ddp::update::replicated>(1, opt)[0]));  // the clip bit
  for (int world : {1, 2, 3, 6}) {
    CAPTURE(world);
    for (const auto& rank : train<invariant, ddp::update::sharded>(world, opt, clipped)) CHECK(bitwise_equal(rank, reference));
    if (world > 1)
      for (const auto& rank : train<invariant, ddp::update::replicated>(world, opt, clipped))
        CHECK(bitwise_equal(rank, reference));
  }
}

TEST_CASE("reduction::invariant: a module whose gradients the trainer copies, and bf16 parameters with an f32 master, "
          "keep the same bits at 1, 3 and 8 ranks") {
  const ddp::optim::adamw opt{.lr = 0.01f};
  using invariant = ddp::reduction::invariant<shards>;
  run_options bf16;
  bf16.precision = ddp::dtype::bf16;
  const auto unbound = train<invariant, ddp::update::sharded, test::unbound_mlp>(1, opt)[0];
  const auto half = train<invariant, ddp::update::sharded>(1, opt, bf16)[0];
  CHECK(bitwise_equal(unbound, train<invariant, ddp::update::sharded>(1, opt)[0]));  // bound or not, one sum
  for (int world : {3, 8}) {
    CAPTURE(world);
    for (const auto& rank : train<invariant, ddp::update::sharded, test::unbound_mlp>(world, opt))
      CHECK(bitwise_equal(rank, unbound));
    for (const auto& rank : train<invariant, ddp::update::sharded>(world, opt, bf16)) CHECK(bitwise_equal(rank, half));
  }
}

TEST_CASE("the plain reduction, dealt the same way, differs between world sizes: the invariance check can fail") {
  const ddp::optim::adamw opt{.lr = 0.01f};
  const auto one = train<ddp::reduction::plain, ddp::update::replicated>(1, opt)[0];
  bool any_differs = false;
  for (int world : {2, 3, 4}) any_differs = any_differs || !bitwise_equal(train<ddp::reduction::plain, ddp::update::replicated>(world, opt)[0], one);
  CHECK(any_differs);
}

TEST_CASE("reduction::invariant: a step with another number of micro-batches than V is an error on every rank") {
  const auto errors = ddp::inproc::launch(2, [&](ddp::inproc::communicator& comm) {
    test::mlp model(test::make_mlp(7));
    ddp::host::device dev;
    ddp::trainer<test::mlp, ddp::reduction::invariant<4>> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.1f});
    const auto b = test::make_batch(4, 1);
    auto f = [&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); };
    try {
      trainer.accumulate(f);  // rank 0 runs 3 micro-batches, rank 1 two: 5, not 4
      if (comm.rank() == 0) trainer.accumulate(f);
      trainer.step(f);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  });
  for (const auto& e : errors) {
    CHECK(e.find("under reduction::invariant<4> a step is 4 micro-batches over all ranks") != std::string::npos);
    CHECK(e.find("ran 5") != std::string::npos);
  }
}

TEST_CASE("reduction::invariant: a world of more ranks than virtual shards is refused when the trainer is built, "
          "the cause and the fix on the first line") {
  const auto errors = ddp::inproc::launch(7, [&](ddp::inproc::communicator& comm) {
    test::mlp model(test::make_mlp(7));
    ddp::host::device dev;
    try {
      ddp::trainer<test::mlp, ddp::reduction::invariant<6>> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.1f});
    } catch (const ddp::collective_error& e) {
      return std::string(e.what());
    }
    return std::string();
  });
  for (int r = 0; r < 7; ++r) {
    CAPTURE(errors[r]);
    CHECK(test::first_line(errors[r]) ==
          "ddp[trainer] construct on rank " + std::to_string(r) +
              ": a world of 7 ranks cannot hold 6 virtual shards, one at least per rank: run at most 6 ranks, or "
              "choose more shards (reduction::invariant<V>)");
  }
}

TEST_CASE_TEMPLATE("reduction::invariant: saved at 4 ranks and resumed at 3, 1 or 8, bitwise the run that never stopped",
                   Update, ddp::update::replicated, ddp::update::sharded, ddp::update::sharded_gradients,
                   ddp::update::fully_sharded) {
  const ddp::optim::adamw opt{.lr = 0.01f, .weight_decay = 1e-2f};
  using invariant = ddp::reduction::invariant<shards>;
  const auto dir = std::filesystem::temp_directory_path() / ("ddp_invariance_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const auto whole = train<invariant, Update>(4, opt)[0];
  train<invariant, Update>(4, opt, {.from = 0, .to = 3, .checkpoint = dir, .save = true});
  for (int world : {3, 1, 8}) {
    if (ddp::update::shards_parameters<Update>() && world == 3) world = 2;  // a world that divides the shards
    CAPTURE(world);
    const auto resumed = train<invariant, Update>(world, opt, {.from = 3, .to = steps, .checkpoint = dir});
    for (const auto& rank : resumed) CHECK(bitwise_equal(rank, whole));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE_TEMPLATE("reduction::invariant with batch norm: each shard normalises with its own statistics and the running "
                   "statistics take every shard's in shard order, the same bits at 1, 2, 3, 5 and 8 ranks",
                   Update, ddp::update::replicated, ddp::update::sharded) {
  // The running statistics moved too: every step's 8 shards were counted.
  check_same_bits<bn_mlp, Update>(ddp::optim::sgd{.lr = 0.1f, .momentum = 0.9f}, make_bn_mlp(7), {2, 3, 5, 8});
}

TEST_CASE("reduction::invariant with a frozen batch norm before a training one: the frozen one records nothing, the "
          "same bits at 1, 3 and 8 ranks") {
  check_same_bits(ddp::optim::sgd{.lr = 0.1f, .momentum = 0.9f}, make_frozen_bn_mlp(7), {3, 8});
}

TEST_CASE("reduction::invariant with dropout: each virtual shard draws its mask from its own stream, the same bits at "
          "1, 3 and 8 ranks") {
  check_same_bits(ddp::optim::sgd{.lr = 0.1f, .momentum = 0.9f}, make_dropout_mlp(7), {3, 8});
}

TEST_CASE("reduction::invariant with batch norm inside a residual branch: the same bits at 1, 3 and 8 ranks") {
  check_same_bits(ddp::optim::adamw{.lr = 0.01f}, make_residual_bn_mlp(7), {3, 8});
}

namespace {
// test::mlp without its deferred buffer updates: tracked_affine's running mean then moves with
// each forward, which depends on the shards a rank runs.
class undeferred_mlp {
 public:
  using input_type = ddp::nn::matrix;
  using output_type = ddp::nn::matrix;
  static constexpr bool reports_gradient_ready = true;
  explicit undeferred_mlp(test::mlp m) : m_(std::move(m)) {}
  std::vector<ddp::parameter_ref> parameters() { return m_.parameters(); }
  std::vector<ddp::buffer_ref> buffers() { return m_.buffers(); }
  ddp::nn::matrix forward(const ddp::nn::matrix& x) { return m_.forward(x); }
  void backward(const ddp::nn::matrix& g, const ddp::ready_sink& ready) { m_.backward(g, ready); }

 private:
  test::mlp m_;
};
}  // namespace

TEST_CASE("reduction::invariant: a buffer that a forward changes without deferring it is an error naming the buffer") {
  const auto errors = ddp::inproc::launch(2, [&](ddp::inproc::communicator& comm) {
    undeferred_mlp model(test::make_mlp(7));
    ddp::host::device dev;
    ddp::trainer<undeferred_mlp, ddp::reduction::invariant<2>> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.1f});
    const auto b = test::make_batch(4, 1);
    try {
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  });
  for (const auto& e : errors) {
    CHECK(e.find("buffer '1.running_mean' changed during a step on rank 0 under reduction::invariant<2>") != std::string::npos);
    CHECK(e.find("apply_buffer_updates") != std::string::npos);
  }
}

TEST_CASE("reduction::invariant: trainer.evaluate's loss sum is the same bits at 1, 2, 3 and 8 ranks (the plain "
          "reduction's is not)") {
  const test::toy_dataset data(203, 11);  // 203 samples: virtual shards of 26 and 25, padded
  auto evaluate_at = [&]<class Reduction>(int world, Reduction) {
    return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
      test::mlp model = test::make_mlp(5);
      ddp::host::device dev;
      ddp::trainer<test::mlp, Reduction> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.1f});
      const ddp::data::loader loader(data, 7, &test::toy_dataset::collate);
      return trainer.evaluate(loader, [&](const auto& b) {
        const auto ce = ddp::nn::softmax_cross_entropy(model.forward(b.x), b.y, b.weights);
        return std::array<ddp::metric, 2>{ddp::metric{ce.loss_sum, ce.samples},
                                          ddp::metric{static_cast<double>(ce.correct), ce.samples}};
      });
    });
  };
  auto bits = [](double v) { return std::bit_cast<std::uint64_t>(v); };
  const auto one = evaluate_at(1, ddp::reduction::invariant<shards>{})[0];
  CHECK(one[0].count == 203);
  CHECK(one[1].count == 203);
  for (int world : {2, 3, 8}) {
    CAPTURE(world);
    for (const auto& m : evaluate_at(world, ddp::reduction::invariant<shards>{})) {
      CHECK(bits(m[0].sum) == bits(one[0].sum));
      CHECK(m[1].sum == one[1].sum);
      CHECK(m[0].count == 203);
    }
  }
  bool plain_differs = false;
  const auto plain_one = evaluate_at(1, ddp::reduction::plain{})[0];
  for (int world : {2, 3, 8})
    plain_differs = plain_differs || bits(evaluate_at(world, ddp::reduction::plain{})[0][0].sum) != bits(plain_one[0].sum);
  CHECK(plain_differs);
}

TEST_CASE("ddp::exact_metric: trainer.reduce gives the same bits however the terms are spread over 1, 2, 3 or 5 ranks") {
  std::vector<double> terms;
  ddp::splitmix64 rng(3);
  for (int i = 0; i < 300; ++i) terms.push_back(std::ldexp(rng.uniform(0.0f, 1.0f), static_cast<int>(rng.below(30))));
  std::vector<std::uint64_t> sums;
  for (int world : {1, 2, 3, 5}) {
    const auto reduced = ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
      test::mlp model = test::make_mlp(5);
      ddp::host::device dev;
      ddp::trainer<test::mlp> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.1f});
      ddp::exact_metric m;
      for (std::size_t i = static_cast<std::size_t>(comm.rank()); i < terms.size(); i += static_cast<std::size_t>(world))
        m.add(terms[i], 0.5);
      return trainer.reduce(m);
    });
    for (const auto& m : reduced) {
      CHECK(m.count() == 150.0);
      sums.push_back(std::bit_cast<std::uint64_t>(m.sum()));
    }
  }
  for (auto s : sums) CHECK(s == sums[0]);
}

TEST_CASE("reduction::invariant: trainer.epoch_shards over a data set that does not fill its last steps (repeats "
          "weighing nothing) trains to the same bits at 1, 2, 3 and 8 ranks, through two epochs") {
  const test::toy_dataset data(203, 13);  // 8 virtual ranks of 26 (one repeat on three of them), batches of 4
  auto run = [&](int world) {
    return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
      test::mlp model = test::make_mlp(7);
      ddp::host::device dev;
      ddp::trainer<test::mlp, ddp::reduction::invariant<shards>> trainer(model, comm, dev,
                                                                          ddp::optim::sgd{.lr = 0.1f, .momentum = 0.9f});
      const ddp::data::loader loader(data, 4, &test::toy_dataset::collate);
      std::size_t steps = 0;
      double weight = 0;
      for (int epoch = 0; epoch < 2; ++epoch) {
        auto epoch_steps = trainer.epoch_shards(loader);
        CHECK(epoch_steps.size() == trainer.steps_per_epoch(data.size(), 4));
        for (const auto& shards : epoch_steps) {
          trainer.step(shards, [&](auto& r, const auto& b) {
            weight += b.weights.total();
            r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y, b.weights).grad);
          });
          ++steps;
        }
      }
      CHECK(steps == 14);  // ceil(26 / 4) per epoch
      CHECK(trainer.reduce(ddp::metric{0, weight}).count == 2 * 203);  // every sample once per epoch
      return parameters_of(model);
    });
  };
  const auto one = run(1)[0];
  for (int world : {2, 3, 8}) {
    CAPTURE(world);
    for (const auto& rank : run(world)) CHECK(bitwise_equal(rank, one));
  }
}

TEST_CASE("reduction::invariant: join() is refused by name") {
  std::string what;
  try {
    ddp::inproc::launch(2, [&](ddp::inproc::communicator& comm) {
      test::mlp model(test::make_mlp(7));
      ddp::host::device dev;
      ddp::trainer<test::mlp, ddp::reduction::invariant<4>> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.1f});
      trainer.join();
    });
  } catch (const std::exception& e) {
    what = e.what();
  }
  CHECK(what.find("under reduction::invariant<4> every step is its 4 virtual shards") != std::string::npos);
  CHECK(what.find("trainer.epoch_shards(loader)") != std::string::npos);
}

TEST_CASE_TEMPLATE("reduction::invariant: a checkpoint saved in the middle of an epoch_shards() epoch at 4 ranks resumes "
                   "at 3, 1 and 8, bitwise the run that never stopped", Update, ddp::update::replicated,
                   ddp::update::sharded) {
  const test::toy_dataset data(203, 17);
  const auto dir = std::filesystem::temp_directory_path() / ("ddp_invariance_epoch_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  constexpr std::size_t total = 14;  // two epochs of 7 steps
  // Steps [from, to) of the run; saved at `to` when asked, loaded first when `from` > 0.
  auto run = [&](int world, std::size_t from, std::size_t to, bool save, std::size_t batch = 4) {
    return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
      test::mlp model = test::make_mlp(from ? 99 : 7);
      ddp::host::device dev;
      ddp::trainer<test::mlp, ddp::reduction::invariant<shards>, Update, ddp::optim::adamw> trainer(
          model, comm, dev, ddp::optim::adamw{.lr = 0.01f}, {.seed = 5});
      if (from) trainer.load(dir);
      const ddp::data::loader loader(data, batch, &test::toy_dataset::collate);
      std::size_t step = from;
      while (step < to)
        for (const auto& shards : trainer.epoch_shards(loader)) {
          trainer.step(shards, [](auto& r, const auto& b) {
            r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y, b.weights).grad);
          });
          if (++step == to) break;
        }
      if (save) trainer.save(dir);
      return parameters_of(model);
    });
  };
  const auto whole = run(4, 0, total, false)[0];
  run(4, 0, 3, true);  // three of the first epoch's seven steps
  for (int world : {3, 1, 8}) {
    CAPTURE(world);
    for (const auto& rank : run(world, 3, total, false)) CHECK(bitwise_equal(rank, whole));
  }
  // Another batch per shard is another global batch: refused by name, the same on every rank.
  CHECK_THROWS_WITH(run(2, 3, total, false, 8),
                    doctest::Contains("the checkpoint's epoch was taken in batches of 4 per virtual shard, and this "
                                      "loader makes batches of 8"));
  std::filesystem::remove_all(dir);
}

}  // namespace trainer_invariance_test
