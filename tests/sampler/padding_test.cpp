// Every sample counted once: with the distributed sampler's pad mode, the repeated samples weigh
// nothing in the loss, the gradient and the reduced metrics, and a short last batch is kept, so
// an epoch at any world size equals one process over exactly the data set's samples.
#include <doctest/doctest.h>

#include <set>
#include <type_traits>

#include "ddp/data/loader.hpp"
#include "ddp/ddp.hpp"
#include "ddp/host/device.hpp"
#include "ddp/inproc/launch.hpp"
#include "support/on_ranks.hpp"
#include "trainer/test_model.hpp"

namespace sampler_padding_test {

namespace {

using padded = ddp::sampler::distributed<true, ddp::sampler::tail::pad>;
using dropped = ddp::sampler::distributed<true, ddp::sampler::tail::drop>;

// The toy problem, one sample per row (seed 99).
struct points : test::toy_dataset {
  explicit points(std::size_t n) : test::toy_dataset(n, 99) {}
};

struct epoch_result {
  std::vector<std::vector<float>> params;
  std::vector<ddp::metric> loss, correct;  // reduced, one per epoch
  std::size_t steps = 0;
};

// `epochs` epochs of `data` on this rank with `batch` per rank; the loss honours the weights.
template <class Sampler = padded>
epoch_result train(ddp::inproc::communicator& comm, const points& data, std::size_t batch, int epochs) {
  test::mlp model = test::make_mlp(5);
  ddp::host::device dev;
  ddp::trainer<test::mlp, Sampler, ddp::bucket_cap<256>> trainer(
      model, comm, dev, ddp::optim::sgd{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-3f, .nesterov = false},
      {.seed = 3});
  ddp::data::loader loader(data, batch, &points::collate);
  epoch_result out;
  for (int e = 0; e < epochs; ++e) {
    ddp::metric loss, correct;
    const auto batches = trainer.epoch(loader);
    CHECK(batches.size() == trainer.steps_per_epoch(data.size(), batch));
    for (const auto& b : batches) {
      trainer.step([&](auto& replica) {
        auto ce = ddp::nn::softmax_cross_entropy(replica.forward(b.x), b.y, b.weights);
        replica.backward(ce.grad);
        loss.add(ce.loss_sum, ce.samples);
        correct.add(static_cast<double>(ce.correct), ce.samples);
      });
      ++out.steps;
    }
    out.loss.push_back(trainer.reduce(loss));
    out.correct.push_back(trainer.reduce(correct));
  }
  out.params = test::parameter_values(model);
  return out;
}

}  // namespace

TEST_CASE("the distributed sampler's padding is marked: each rank's real count, each step's total") {
  // 10 samples over 3 ranks: 4 indices each; rank 0 has 4 real ones, ranks 1 and 2 three each.
  for (int rank = 0; rank < 3; ++rank) {
    const auto s = ddp::sampler::make_shard<padded>(10, rank, 3, 1, 0);
    CHECK(s.real_counts == std::vector<std::size_t>{4, 3, 3});
    CHECK(s.indices.size() == 4);
    CHECK(s.keep_partial_batch);
  }
  // Every sample is real exactly once; the repeats are what is left.
  std::multiset<std::size_t> real;
  for (int rank = 0; rank < 3; ++rank) {
    const auto s = ddp::sampler::make_shard<padded>(10, rank, 3, 1, 0);
    real.insert(s.indices.begin(), s.indices.begin() + static_cast<std::ptrdiff_t>(s.real_count()));
  }
  CHECK(real == std::multiset<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});

  const points data(10);
  const ddp::data::loader loader(data, 3, &points::collate);
  const auto batches = loader.batches(ddp::sampler::make_shard<padded>(10, 2, 3, 1, 0)).to_vector();
  REQUIRE(batches.size() == 2);  // 3 + a kept short batch of 1
  CHECK(batches[0].y.size() == 3);
  CHECK(batches[0].weights.per_sample == std::vector<float>{1, 1, 1});
  CHECK(batches[0].weights.step_total == 9);
  CHECK(batches[1].y.size() == 1);
  CHECK(batches[1].weights.per_sample == std::vector<float>{0});  // rank 2's 4th index repeats a sample
  CHECK(batches[1].weights.step_total == 1);                       // only rank 0's 4th is real
  CHECK(batches[1].weights.divisor() == doctest::Approx(1.0 / 3));

  // drop mode: no padding, no short batch (3 per rank, batches of 2: one).
  const auto dropped_batches = loader.batches(ddp::sampler::make_shard<dropped>(10, 0, 3, 1, 0)).to_vector();
  CHECK(ddp::sampler::batches_per_epoch<dropped>(10, 3, 3) == 1);
  REQUIRE(dropped_batches.size() == 1);
  CHECK(dropped_batches[0].weights.step_total == 9);
}

TEST_CASE("pad mode: an epoch at any world size equals one process over exactly the data set's samples") {
  constexpr std::size_t per_rank_batch = 2;
  for (std::size_t n : {10, 11, 7}) {
    const points data(n);
    for (int world : {2, 3, 4}) {
      CAPTURE(n);
      CAPTURE(world);
      // The reference: one process, the global batch, the same sampler seed (the same order).
      const auto ref = ddp::inproc::launch(1, [&](ddp::inproc::communicator& comm) {
        return train(comm, data, per_rank_batch * static_cast<std::size_t>(world), 2);
      })[0];
      const auto ranks = ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
        return train(comm, data, per_rank_batch, 2);
      });
      for (const auto& r : ranks) {
        CHECK(r.steps == ref.steps);
        CHECK(test::max_relative_error(r.params, ref.params) <= 1e-5);
        for (std::size_t e = 0; e < 2; ++e) {
          CHECK(r.loss[e].count == static_cast<double>(n));  // every sample once, no repeat
          CHECK(r.correct[e].count == static_cast<double>(n));
          CHECK(r.correct[e].sum == ref.correct[e].sum);
          CHECK(r.loss[e].sum == doctest::Approx(ref.loss[e].sum).epsilon(1e-5));  // from parameters within 1e-5
        }
      }
    }
  }
}

TEST_CASE("an epoch that makes no batch is an error naming the data set, the ranks and the batch") {
  const points data(5);  // dropped: 2 per rank at 2 ranks, no whole batch of 4
  auto o = test::on_ranks(2, [&](ddp::inproc::communicator& comm) { (void)train<dropped>(comm, data, 4, 1); });
  for (const auto& e : o.errors)
    CHECK(test::contains(e, "the epoch makes no batch: a data set of 5 samples dealt to 2 ranks in batches of 4"));
  // A loader keeps a pointer to its data set: a temporary one does not compile.
  using loader_type = ddp::data::loader<points, decltype(&points::collate)>;
  static_assert(std::is_constructible_v<loader_type, const points&, std::size_t, decltype(&points::collate)>);
  static_assert(!std::is_constructible_v<loader_type, points&&, std::size_t, decltype(&points::collate)>);
}

TEST_CASE("unweighted, the padding would count: the weights are what makes pad exact") {
  // The same 10 samples over 3 ranks with a loss that ignores the weights: 12 samples counted.
  const points data(10);
  const auto counts = ddp::inproc::launch(3, [&](ddp::inproc::communicator& comm) {
    test::mlp model = test::make_mlp(5);
    ddp::host::device dev;
    ddp::trainer<test::mlp, padded> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.1f});
    model.eval();
    ddp::data::loader loader(data, 2, &points::collate);
    ddp::metric weighted, unweighted;
    for (const auto& b : trainer.epoch(loader)) {
      const auto ce = ddp::nn::softmax_cross_entropy(model.forward(b.x), b.y, b.weights);
      weighted.add(ce.loss_sum, ce.samples);
      unweighted.add(0.0, static_cast<double>(b.y.size()));
    }
    return std::pair{trainer.reduce(weighted).count, trainer.reduce(unweighted).count};
  });
  for (const auto& [weighted, unweighted] : counts) {
    CHECK(weighted == 10);
    CHECK(unweighted == 12);
  }
}

TEST_CASE("trainer.evaluate: every sample counted once at any world size, in evaluation mode, mode restored") {
  for (std::size_t n : {10, 11, 7}) {
    const points data(n);
    std::vector<double> correct_by_world;
    for (int world : {1, 2, 3, 4}) {
      CAPTURE(n);
      CAPTURE(world);
      const auto results = ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
        test::mlp model = test::make_mlp(5);
        ddp::host::device dev;
        ddp::trainer<test::mlp> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.1f});
        const ddp::data::loader loader(data, 2, &points::collate);
        bool evaluated_in_eval_mode = true;
        const auto metrics = trainer.evaluate(loader, [&](const auto& b) {
          evaluated_in_eval_mode = evaluated_in_eval_mode && !model.training();
          const auto ce = ddp::nn::softmax_cross_entropy(model.forward(b.x), b.y, b.weights);
          return std::array<ddp::metric, 2>{ddp::metric{ce.loss_sum, ce.samples},
                                            ddp::metric{static_cast<double>(ce.correct), ce.samples}};
        });
        CHECK(evaluated_in_eval_mode);
        CHECK(model.training());  // restored
        return metrics;
      });
      for (const auto& m : results) {
        CHECK(m[0].count == static_cast<double>(n));
        CHECK(m[1].count == static_cast<double>(n));
        CHECK(m[1].sum == results[0][1].sum);
      }
      correct_by_world.push_back(results[0][1].sum);
    }
    for (double c : correct_by_world) CHECK(c == correct_by_world[0]);  // the same samples, the same model
  }
}

}  // namespace sampler_padding_test
