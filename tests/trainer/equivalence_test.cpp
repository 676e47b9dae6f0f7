// The heart of it: K steps of data-parallel training equal K steps of one process on the
// global batch, for every valid policy combination, world size, micro-batching and number of
// forwards per step.
#include <doctest/doctest.h>

#include "ddp/inproc/launch.hpp"
#include "ddp/trainer/trainer.hpp"
#include "trainer/equivalence.hpp"
#include "trainer/test_model.hpp"

namespace {

using namespace equivalence;

template <class Sync, class Unused>
std::vector<run_result> distributed(int world, shape how) {
  return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) { return run_rank<Sync, Unused>(comm, how); });
}

template <class Sync, class Unused>
void check_equivalence() {
  for (int world : {1, 2, 3, 4}) {
    const auto ref = reference(world);
    for (auto how : {shape::one_forward, shape::two_forwards, shape::two_micro_batches}) {
      CAPTURE(world);
      CAPTURE(static_cast<int>(how));
      INFO("buffer_sync::", Sync::name, " unused_params::", Unused::name);
      const auto ranks = distributed<Sync, Unused>(world, how);
      for (const auto& rank : ranks) CHECK(test::max_relative_error(rank.params, ref.params) <= 1e-5);
      // Buffers: averaging keeps the running mean equal to the global batch's (its update is
      // linear in the batch mean); broadcasts keep every rank on rank 0's.
      if constexpr (std::is_same_v<Sync, ddp::buffer_sync::average_once_per_step>) {
        if (how == shape::one_forward) {
          std::vector<float> mean(ref.running_mean.size(), 0.0f);
          for (const auto& rank : ranks)
            for (std::size_t c = 0; c < mean.size(); ++c) mean[c] += rank.running_mean[c] / static_cast<float>(world);
          for (std::size_t c = 0; c < mean.size(); ++c) CHECK(mean[c] == doctest::Approx(ref.running_mean[c]).epsilon(1e-5));
        }
      }
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("N ranks equal one process on the global batch", Unused, ddp::unused_params::forbid,
                   ddp::unused_params::detect_each_step, ddp::unused_params::static_graph) {
  SUBCASE("buffer_sync::none") { check_equivalence<ddp::buffer_sync::none, Unused>(); }
  SUBCASE("buffer_sync::broadcast_each_forward") { check_equivalence<ddp::buffer_sync::broadcast_each_forward, Unused>(); }
  SUBCASE("buffer_sync::broadcast_once_per_step") { check_equivalence<ddp::buffer_sync::broadcast_once_per_step, Unused>(); }
  SUBCASE("buffer_sync::average_once_per_step") { check_equivalence<ddp::buffer_sync::average_once_per_step, Unused>(); }
}

TEST_CASE("broadcast policies leave every rank with rank 0's buffers at the start of a step") {
  auto results = ddp::inproc::launch(3, [](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(seed);
    ddp::host::device dev;
    ddp::trainer<test::mlp, ddp::buffer_sync::broadcast_once_per_step> trainer(model, comm, dev, sgd);
    std::vector<float> seen;
    for (int s = 0; s < 2; ++s) {
      auto b = test::make_batch(per_rank_batch, 77 + static_cast<std::uint64_t>(comm.rank()) * 10 + s);
      trainer.step([&](auto& rep) {
        auto out = rep.forward(b.x);
        auto ce = ddp::nn::softmax_cross_entropy(out, b.y);
        rep.backward(ce.grad);
      });
    }
    // In the last step every rank starts from rank 0's broadcast buffers and updates them with
    // the same batch, so they must end equal.
    trainer.step([&](auto& rep) {
      auto b = test::make_batch(per_rank_batch, 5);
      auto out = rep.forward(b.x);
      auto ce = ddp::nn::softmax_cross_entropy(out, b.y);
      rep.backward(ce.grad);
    });
    auto rm = model.layer<1>().running_mean();
    return std::vector<float>(rm.begin(), rm.end());
  });
  // Each rank updated rank 0's broadcast buffer with the same batch (seed 5) in the last step.
  CHECK(results[1] == results[0]);
  CHECK(results[2] == results[0]);
}
