// The optimizer overlapped with the reductions (trainer.overlap_optimizer): each bucket is updated
// as soon as its own reduction completed, while later buckets still reduce. Every update strategy
// keeps its bits with micro-batches, clipping, hooks and Join; the step's verdict (the
// unused-parameter rule) comes before any bucket is updated; and a step that fails once its
// update began leaves a torn state, which a rank refuses to hand over (elastic training).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unistd.h>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/host/linalg.hpp"
#include "ddp/inproc/elastic.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/policy/powersgd.hpp"
#include "trainer/counting_communicator.hpp"
#include "trainer/deep_run.hpp"
#include "trainer/equivalence.hpp"
#include "trainer/test_model.hpp"

namespace trainer_overlap_test {

namespace {

using ddp::inproc::communicator;
using options = test::deep_run_options;
using test::train_deep;

// Overlapped and not, on `world` ranks: the same bits on every rank.
template <class Update, class Optimizer, class... More>
void check_same_bits(int world, options o) {
  CAPTURE(world);
  CAPTURE(o.micro_batches);
  CAPTURE(o.clip);
  CAPTURE(o.join_after);
  const auto plain = train_deep<Update, Optimizer, More...>(world, o);
  o.overlap = true;
  const auto overlapped = train_deep<Update, Optimizer, More...>(world, o);
  REQUIRE(overlapped.size() == plain.size());
  for (std::size_t r = 0; r < plain.size(); ++r) {
    CHECK(overlapped[r].params == plain[r].params);
    CHECK_FALSE(plain[r].waited_inside_update);
    CHECK(overlapped[r].waited_inside_update);  // with clipping, for every bucket before the first update
  }
  auto untrained = test::make_deep_mlp();
  CHECK(overlapped.front().params != test::held_values(untrained));
}

// SGD whose `fail_at`-th rule (one per run of parameters in a bucket's shard) throws: on every
// rank alike (a collective_error), or as this rank's own failure.
struct failing_sgd : ddp::optim::sgd {
  static constexpr std::string_view name = "failing_sgd";
  int* calls = nullptr;
  int fail_at = 0;
  bool on_every_rank = true;
  rule at(std::int64_t t) const {
    if (++*calls == fail_at) {
      if (on_every_rank) throw ddp::collective_error("test", "optimizer", 0, "a rule that fails on every rank");
      throw std::runtime_error("a rule that fails on this rank");
    }
    return sgd::at(t);
  }
};

}  // namespace

TEST_CASE("overlap_optimizer: replicated, sharded and sharded_gradients updates keep their bits, with micro-batches") {
  using ddp::optim::sgd, ddp::optim::adamw;
  for (int world : {1, 2, 3})
    for (bool micro : {false, true}) {
      check_same_bits<ddp::update::replicated, sgd>(world, {.micro_batches = micro});
      check_same_bits<ddp::update::sharded, adamw>(world, {.micro_batches = micro});
      check_same_bits<ddp::update::sharded_gradients, adamw>(world, {.micro_batches = micro});
    }
}

TEST_CASE("overlap_optimizer with one bucket: the control floats stay in it, the plain step's bits and bytes") {
  auto run = [](bool overlap) {
    return ddp::inproc::launch(2, [&](communicator& inner) {
      test::counting_communicator<communicator> comm(inner);
      auto model = test::make_deep_mlp();
      ddp::host::device dev;
      ddp::trainer<test::deep_mlp, ddp::use_communicator<test::counting_communicator<communicator>>> trainer(
          model, comm, dev, equivalence::sgd);
      trainer.overlap_optimizer(overlap);
      for (int s = 0; s < 3; ++s) {
        const auto b = test::make_batch(8, 60 + static_cast<std::uint64_t>(10 * s + inner.rank()));
        trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
      }
      return std::pair{test::held_values(model), comm.all_reduce_calls()};
    });
  };
  const auto plain = run(false), overlapped = run(true);
  for (std::size_t r = 0; r < plain.size(); ++r) {
    CHECK(overlapped[r].first == plain[r].first);
    CHECK(overlapped[r].second == plain[r].second);  // no collective of the control floats' own
  }
}

TEST_CASE("overlap_optimizer keeps the bits with clipping, communication hooks, the unused-parameter rule and Join") {
  using ddp::optim::sgd, ddp::optim::adamw;
  for (int world : {2, 3}) {
    // Clipping needs every bucket's norm first: the update waits for all reductions, as without overlap.
    check_same_bits<ddp::update::replicated, sgd>(world, {.clip = 0.05f});
    check_same_bits<ddp::update::sharded_gradients, adamw>(world, {.micro_batches = true, .clip = 0.05f});
    check_same_bits<ddp::update::replicated, adamw, ddp::comm_hook::bf16>(world, {.micro_batches = true});
    check_same_bits<ddp::update::replicated, sgd, ddp::comm_hook::powersgd<1>>(world, {});
    check_same_bits<ddp::update::replicated, sgd, ddp::unused_params::detect_each_step>(world, {.micro_batches = true});
    check_same_bits<ddp::update::sharded, sgd, ddp::unused_params::static_graph>(world, {});
    check_same_bits<ddp::update::replicated, adamw, ddp::unused_params::unchecked>(world, {});
    check_same_bits<ddp::update::replicated, sgd>(world, {.join_after = 2});
  }
}

TEST_CASE("overlap_optimizer: each bucket waits for its own reduction inside the update, in bucket order") {
  auto phases = [](bool overlap) {
    return ddp::inproc::launch(2, [&](communicator& comm) {
      auto model = test::make_deep_mlp();
      ddp::host::device dev;
      ddp::trainer<test::deep_mlp, ddp::optim::sgd, ddp::bucket_cap<2400>> trainer(model, comm, dev, equivalence::sgd);
      trainer.overlap_optimizer(overlap);
      ddp::timeline timeline;
      trainer.record_timeline(&timeline);
      const auto b = test::make_batch(8, 7 + static_cast<std::uint64_t>(comm.rank()));
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
      // How many waits for reductions began inside the update, and how many before it.
      const auto& events = timeline.events();
      const auto update = std::ranges::find(events, std::string("update"), &ddp::timeline_event::name);
      REQUIRE(update != events.end());
      std::pair<int, int> inside_before{0, 0};
      for (const auto& e : events)
        if (e.name == "wait for reductions")
          ++(e.begin >= update->begin && e.end <= update->end ? inside_before.first : inside_before.second);
      return std::pair{inside_before, trainer.bucket_count()};
    });
  };
  for (const auto& [counts, buckets] : phases(false)) CHECK(counts == std::pair{0, 1});
  for (const auto& [counts, buckets] : phases(true)) {
    REQUIRE(buckets == 10);
    CHECK(counts == std::pair{static_cast<int>(buckets), 0});
  }
}

TEST_CASE("overlap_optimizer moves the bytes of the plain update: the control floats in a collective of their own") {
  constexpr int steps = 2;
  auto count = [&]<class Update>(bool overlap) {
    return ddp::inproc::launch(3, [&](communicator& inner) {
      test::counting_communicator<communicator> comm(inner);
      auto model = test::make_deep_mlp();
      ddp::host::device dev;
      ddp::trainer<test::deep_mlp, Update, ddp::bucket_cap<2400>,
                   ddp::use_communicator<test::counting_communicator<communicator>>>
          trainer(model, comm, dev, equivalence::sgd);
      trainer.overlap_optimizer(overlap);
      const auto b = test::make_batch(8, 50 + static_cast<std::uint64_t>(inner.rank()));
      const auto bytes = comm.bytes();
      const auto calls = comm.all_reduce_calls();
      for (int s = 0; s < steps; ++s)
        trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
      return std::pair{comm.bytes() - bytes, comm.all_reduce_calls() - calls};
    });
  };
  auto check = [&]<class Update>(std::size_t more_calls_per_step) {
    CAPTURE(Update::name);
    const auto plain = count.template operator()<Update>(false), overlapped = count.template operator()<Update>(true);
    for (std::size_t r = 0; r < plain.size(); ++r) {
      CHECK(overlapped[r].first.all_reduce == plain[r].first.all_reduce);
      CHECK(overlapped[r].first.reduce_scatter == plain[r].first.reduce_scatter);
      CHECK(overlapped[r].first.all_gather == plain[r].first.all_gather);
      CHECK(overlapped[r].first.all_reduce > 0);
      CHECK(overlapped[r].second == plain[r].second + more_calls_per_step * steps);
    }
  };
  // Replicated: the control floats leave the last bucket's all_reduce; sharded: they were alone already.
  check.template operator()<ddp::update::replicated>(1);
  check.template operator()<ddp::update::sharded>(0);
}

TEST_CASE("overlap_optimizer: a parameter one rank left unused is refused before any bucket is updated, and the "
          "state handed over is the step's before") {
  const auto got = ddp::inproc::launch(3, [&](communicator& comm) {
    test::branchy model(5);
    ddp::host::device dev;
    // Small buckets: the trunk's and the branch's parameters reduce apart.
    ddp::trainer<test::branchy, ddp::bucket_cap<64>> trainer(model, comm, dev, equivalence::sgd);
    trainer.overlap_optimizer();
    const auto b = test::make_batch(6, 20 + static_cast<std::uint64_t>(comm.rank()));
    auto step = [&] { trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); }); };
    step();
    const auto before = test::parameter_values(model);
    model.use_aux = comm.rank() != 1;
    std::string error;
    try {
      step();
    } catch (const std::exception& e) {
      error = e.what();
    }
    ddp::detail::checkpoint_file f;
    CHECK_NOTHROW(trainer.last_step_state().write(f));  // what an elastic run's survivor hands over
    return std::tuple{error, test::parameter_values(model) == before, trainer.bucket_count()};
  });
  for (const auto& rank : got) {
    const std::string& error = std::get<0>(rank);
    CAPTURE(error);
    CHECK(std::get<2>(rank) > 1);  // buckets
    CHECK(error.find("'aux.weight' (no gradient on rank(s) 1)") != std::string::npos);
    CHECK(std::get<1>(rank));  // the parameters are the step's before
  }
}

TEST_CASE("a step that fails after its update began leaves a torn state, which a rank refuses to hand over") {
  for (bool overlap : {false, true}) {
    CAPTURE(overlap);
    ddp::inproc::launch(2, [&](communicator& comm) {
      auto model = test::make_deep_mlp();
      ddp::host::device dev;
      int calls = 0;
      failing_sgd opt;
      opt.lr = 0.1f, opt.calls = &calls, opt.fail_at = 13;  // the third bucket of the second step
      ddp::trainer<test::deep_mlp, failing_sgd, ddp::bucket_cap<2400>> trainer(model, comm, dev, opt);
      trainer.overlap_optimizer(overlap);
      const auto b = test::make_batch(8, 9 + static_cast<std::uint64_t>(comm.rank()));
      auto step = [&] { trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); }); };
      step();
      ddp::detail::checkpoint_file f;
      CHECK_NOTHROW(trainer.last_step_state().write(f));
      CHECK_THROWS_WITH(step(), doctest::Contains("a rule that fails on every rank"));
      CHECK_THROWS_WITH(trainer.last_step_state().write(f),
                        doctest::Contains("the step after the 1 completed ones failed after its update had begun"));
      return 0;
    });
  }
}

TEST_CASE("elastic: a survivor that a peer's failure tore in its sharded update hands over no state, and the run falls "
          "back to the last checkpoint") {
  const auto dir = std::filesystem::temp_directory_path() / ("ddp_overlap_torn_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const auto report = ddp::inproc::launch_elastic(2, [&](communicator& comm) {
    const bool first_membership = comm.handoff().shared().restarts() == 0;
    auto model = test::make_deep_mlp();
    ddp::host::device dev;
    int calls = 0;
    failing_sgd opt;
    opt.lr = 0.1f, opt.calls = &calls, opt.on_every_rank = false;
    // Rank 1 fails at its shard of the third bucket in the second step, after it updated two; rank 0
    // updates every bucket and then waits for rank 1's all-gathers.
    if (first_membership && comm.rank() == 1) opt.fail_at = 13;
    ddp::trainer<test::deep_mlp, ddp::update::sharded, failing_sgd, ddp::bucket_cap<2400>> trainer(model, comm, dev,
                                                                                                   opt);
    trainer.overlap_optimizer();
    while (trainer.steps() < 4) {
      const auto b = test::make_batch(8, 80 + 10 * trainer.steps() + static_cast<std::uint64_t>(comm.rank()));
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
      if (trainer.steps() == 1) trainer.save(dir);
    }
  });
  std::filesystem::remove_all(dir);
  REQUIRE(report.changes.size() == 1);
  CHECK(report.changes[0].failed_rank == 1);
  CHECK(report.changes[0].steps == 1);
  CHECK(report.changes[0].resumed_at == 1);
  CHECK(report.changes[0].checkpoint == dir.string());
}

}  // namespace trainer_overlap_test
