// Elastic in-process ranks (ddp::inproc::launch_elastic): a rank throws at a chosen step and
// micro-batch, the ranks that remain continue from the last completed step without restarting
// the process, every sample of the epoch is taken exactly once across the memberships, and
// under reduction::invariant the final parameters are bitwise those of an uninterrupted run.
// Ranks that join at a step boundary start from a peer's state and keep the same properties.
// A checkpoint saved in the middle of an epoch continues at another world size the same way.
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <vector>

#include "ddp/data/loader.hpp"
#include "ddp/inproc/elastic.hpp"
#include "trainer/indexed_rows.hpp"
#include "trainer/invariance.hpp"

namespace trainer_elastic_test {

namespace {

namespace fs = std::filesystem;
using invariance::bitwise_equal;
using invariance::parameters_of;

using test::indexed_rows;
using test::real_samples;

// Where a rank throws: its rank in the first membership, the step and the micro-batch of it.
struct fault {
  int rank = -1;
  std::uint64_t step = 0;
  std::size_t micro_batch = 0;
  int membership = 0;  // the membership it strikes in (0: the first)
};

// The samples of every completed step, per epoch (weight-0 padding left out).
struct taken_samples {
  std::mutex mutex;
  std::map<std::uint64_t, std::multiset<std::size_t>> by_epoch;
  void add(std::uint64_t epoch, const std::vector<std::size_t>& samples) {
    std::lock_guard lock(mutex);
    by_epoch[epoch].insert(samples.begin(), samples.end());
  }
  // Each epoch took every sample exactly once.
  bool each_once(std::size_t n, std::uint64_t epochs) {
    std::multiset<std::size_t> all;
    for (std::size_t i = 0; i < n; ++i) all.insert(i);
    if (by_epoch.size() != epochs) return false;
    for (const auto& [epoch, samples] : by_epoch)
      if (samples != all) return false;
    return true;
  }
};

struct run_result {
  std::vector<std::vector<float>> params;  // by rank of the last membership
  std::mutex mutex;
};

// Which membership this rank runs in (0: the first; launch() has only that one).
int membership_of(const ddp::inproc::communicator& comm) {
  const auto h = comm.handoff();
  return h ? h.shared().restarts() : 0;
}

constexpr std::size_t rows = 96, epochs = 2;

// Two epochs of `data` under reduction::invariant<8> (epoch_shards, shard batches of 3: 24 samples
// a step, 4 steps an epoch), restarted where a fault strikes. The loop is the one any run that
// resumes from a checkpoint has: it goes on from the trainer's epoch and step.
// With `checkpoints`, a checkpoint is saved there every 2 steps; `before_step(comm, steps)` runs
// before each step.
using step_hook = std::function<void(const ddp::inproc::communicator&, std::uint64_t steps)>;
template <class Update, class Model, class Optimizer>
void invariant_rank(ddp::inproc::communicator& comm, const indexed_rows& data, Optimizer opt,
                    const std::vector<fault>& faults, taken_samples& taken, run_result& result,
                    const fs::path& checkpoints = {}, const step_hook& before_step = {}) {
  Model model = [] {
    if constexpr (std::is_same_v<Model, invariance::bn_mlp>) return invariance::make_bn_mlp(7);
    else return test::make_mlp(7);
  }();
  ddp::host::device dev;
  ddp::trainer<Model, ddp::reduction::invariant<8>, Update, Optimizer, ddp::bucket_cap<512>> trainer(model, comm, dev,
                                                                                                     opt, {.seed = 4});
  ddp::data::loader loader(data, 3, &indexed_rows::collate);
  const int membership = membership_of(comm);
  while (trainer.epochs_started() < epochs) {
    const std::uint64_t epoch = trainer.epochs_started();
    for (const auto& shards : trainer.epoch_shards(loader)) {
      if (before_step) before_step(comm, trainer.steps());
      std::size_t micro = 0;
      std::vector<std::size_t> mine;
      trainer.step(shards, [&](auto& replica, const auto& b) {
        for (const auto& f : faults)
          if (f.membership == membership && f.rank == comm.rank() && f.step == trainer.steps() && f.micro_batch == micro)
            throw std::runtime_error("injected fault");
        ++micro;
        const auto r = real_samples(b);
        mine.insert(mine.end(), r.begin(), r.end());
        auto ce = ddp::nn::softmax_cross_entropy(replica.forward(b.x), b.y, b.weights);
        replica.backward(ce.grad);
      });
      taken.add(epoch, mine);
      if (!checkpoints.empty() && trainer.steps() % 2 == 0) trainer.save(checkpoints);
    }
  }
  std::lock_guard lock(result.mutex);
  result.params.resize(static_cast<std::size_t>(comm.size()));
  result.params[static_cast<std::size_t>(comm.rank())] = parameters_of(invariance::underlying(model));
}

// The uninterrupted run, at one rank: its parameters (each sample taken once per epoch).
template <class Update, class Model, class Optimizer>
std::vector<float> one_rank_run(const indexed_rows& data, Optimizer opt) {
  run_result reference;
  taken_samples reference_taken;
  ddp::inproc::launch(1, [&](ddp::inproc::communicator& c) {
    invariant_rank<Update, Model>(c, data, opt, {}, reference_taken, reference);
  });
  REQUIRE(reference_taken.each_once(rows, epochs));
  return reference.params[0];
}

template <class Update, class Model, class Optimizer>
void check_invariant_elastic(Optimizer opt) {
  const indexed_rows data(rows);
  const auto reference = one_rank_run<ddp::update::replicated, Model>(data, opt);

  // 4 ranks; rank 2 throws in its second micro-batch of step 5 (the second epoch), then the new
  // rank 0 in its first micro-batch of step 6: the run ends at 2 ranks.
  run_result elastic;
  taken_samples taken;
  const std::vector<fault> faults{{2, 5, 1, 0}, {0, 6, 0, 1}};
  const auto report = ddp::inproc::launch_elastic(4, [&](ddp::inproc::communicator& c) {
    invariant_rank<Update, Model>(c, data, opt, faults, taken, elastic);
  });
  CHECK(report.world_size == 2);
  REQUIRE(report.changes.size() == 2);
  CHECK(report.changes[0].failed_rank == 2);
  CHECK(report.changes[0].steps == 5);
  CHECK(report.changes[0].old_world == 4);
  CHECK(report.changes[0].new_world == 3);
  CHECK(report.changes[0].survivors == std::vector<int>{0, 1, 3});
  CHECK(report.changes[0].cause.find("injected fault") != std::string::npos);
  CHECK(report.changes[1].failed_rank == 0);
  CHECK(report.changes[1].steps == 6);
  CHECK(report.changes[1].new_world == 2);
  CHECK(report.changes[1].failed_ranks == std::vector<int>{0});
  CHECK(taken.each_once(rows, epochs));
  REQUIRE(elastic.params.size() == 2);
  for (const auto& rank : elastic.params) CHECK(bitwise_equal(rank, reference));

  // Ranks 1 and 2 throw in the same step: one change names both, each with its error.
  run_result both;
  taken_samples taken_both;
  const std::vector<fault> at_once{{1, 3, 0, 0}, {2, 3, 0, 0}};
  const auto two = ddp::inproc::launch_elastic(4, [&](ddp::inproc::communicator& c) {
    invariant_rank<Update, Model>(c, data, opt, at_once, taken_both, both);
  });
  REQUIRE(two.changes.size() == 1);
  auto lost = two.changes[0].failed_ranks;
  CHECK(lost.front() == two.changes[0].failed_rank);
  std::sort(lost.begin(), lost.end());
  CHECK(lost == std::vector<int>{1, 2});
  REQUIRE(two.changes[0].causes.size() == 2);
  for (const auto& cause : two.changes[0].causes) CHECK(cause.find("injected fault") != std::string::npos);
  CHECK(two.changes[0].survivors == std::vector<int>{0, 3});
  CHECK(taken_both.each_once(rows, epochs));
  for (const auto& rank : both.params) CHECK(bitwise_equal(rank, reference));
}

// The plain reduction with the distributed sampler: the interrupted epoch is re-cut for the
// ranks that remain, and every sample is still taken once.
void plain_rank(ddp::inproc::communicator& comm, const indexed_rows& data, const std::vector<fault>& faults,
                taken_samples& taken, run_result& result, const step_hook& before_step = {}) {
  test::mlp model = test::make_mlp(3);
  ddp::host::device dev;
  ddp::trainer<test::mlp, ddp::bucket_cap<512>> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.1f, .momentum = 0.9f},
                                                         {.seed = 8});
  ddp::data::loader loader(data, 4, &indexed_rows::collate);
  const int membership = membership_of(comm);
  while (trainer.epochs_started() < epochs) {
    const std::uint64_t epoch = trainer.epochs_started();
    for (const auto& b : trainer.epoch(loader)) {
      if (before_step) before_step(comm, trainer.steps());
      for (const auto& f : faults)
        if (f.membership == membership && f.rank == comm.rank() && f.step == trainer.steps())
          throw std::runtime_error("injected fault");
      trainer.step([&](auto& replica) {
        replica.backward(ddp::nn::softmax_cross_entropy(replica.forward(b.x), b.y, b.weights).grad);
      });
      taken.add(epoch, real_samples(b));
    }
  }
  std::lock_guard lock(result.mutex);
  result.params.resize(static_cast<std::size_t>(comm.size()));
  // The parameters (each rank's buffers are its own statistics under the plain reduction).
  for (const auto& p : test::parameter_values(model))
    result.params[static_cast<std::size_t>(comm.rank())].insert(result.params[static_cast<std::size_t>(comm.rank())].end(),
                                                                 p.begin(), p.end());
}

// plain_rank's run under launch_elastic from `world` ranks: every sample of each epoch taken
// once across the memberships, and the ranks of the last one with the same parameters.
ddp::inproc::elastic_report check_plain_elastic(int world, const std::vector<fault>& faults,
                                                ddp::inproc::elastic_options opts = {}) {
  const indexed_rows data(rows);
  run_result result;
  taken_samples taken;
  const auto report = ddp::inproc::launch_elastic(
      world, [&](ddp::inproc::communicator& c) { plain_rank(c, data, faults, taken, result); }, opts);
  CHECK(taken.each_once(rows, epochs));
  REQUIRE(result.params.size() == static_cast<std::size_t>(report.world_size));
  for (const auto& rank : result.params) CHECK(rank == result.params[0]);
  return report;
}

}  // namespace

TEST_CASE_TEMPLATE("launch_elastic under reduction::invariant: two ranks lost mid-step, every sample once, the "
                   "uninterrupted run's bits",
                   Model, test::mlp, invariance::bn_mlp) {
  SUBCASE("sgd with momentum") {
    check_invariant_elastic<ddp::update::replicated, Model>(ddp::optim::sgd{.lr = 0.1f, .momentum = 0.9f});
  }
  SUBCASE("adamw") { check_invariant_elastic<ddp::update::replicated, Model>(ddp::optim::adamw{.lr = 0.01f}); }
}

TEST_CASE("launch_elastic under the plain reduction: the interrupted epoch is re-cut for the ranks that remain") {
  // 3 ranks x 4: 8 steps an epoch; then 2 ranks x 4 for the rest
  const auto report = check_plain_elastic(3, {{1, 11, 0, 0}});
  REQUIRE(report.changes.size() == 1);
  CHECK(report.changes[0].steps == 11);
  CHECK(report.world_size == 2);
}

TEST_CASE("launch_elastic under a sharded update falls back to the last checkpoint every rank saved (the failed rank's "
          "shard of the optimizer state went with it), bitwise, without one it cannot go on, nor past max_restarts") {
  const indexed_rows data(rows);
  const ddp::optim::adamw opt{.lr = 0.01f};
  const auto reference = one_rank_run<ddp::update::sharded, test::mlp>(data, opt);
  // 3 ranks save every 2 steps; rank 1 fails in step 5: the 2 others go back to step 4.
  const auto dir = fs::temp_directory_path() / ("ddp_elastic_sharded_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  run_result elastic;
  taken_samples taken;
  const auto report = ddp::inproc::launch_elastic(3, [&](ddp::inproc::communicator& c) {
    invariant_rank<ddp::update::sharded, test::mlp>(c, data, opt, {{1, 5, 0, 0}}, taken, elastic, dir);
  });
  fs::remove_all(dir);
  REQUIRE(report.changes.size() == 1);
  CHECK(report.changes[0].steps == 5);
  CHECK(report.changes[0].resumed_at == 4);
  CHECK(report.changes[0].checkpoint == dir.string());
  REQUIRE(elastic.params.size() == 2);
  for (const auto& rank : elastic.params) CHECK(bitwise_equal(rank, reference));

  try {
    ddp::inproc::launch_elastic(3, [&](ddp::inproc::communicator& c) {
      invariant_rank<ddp::update::sharded, test::mlp>(c, data, opt, {{1, 2, 0, 0}}, taken, elastic);
    });
    FAIL("the run went on without the sharded state of rank 1");
  } catch (const ddp::error& e) {
    const std::string what = e.what();
    CHECK(what.find("cannot go on without rank 1") != std::string::npos);
    CHECK(what.find("sharded update") != std::string::npos);
    CHECK(what.find("no checkpoint that every rank saved") != std::string::npos);
    CHECK(what.find("injected fault") != std::string::npos);
  }
  taken_samples unused;
  run_result result;
  // Rank 0 fails in every membership: after one restart the second failure ends the run.
  try {
    ddp::inproc::launch_elastic(
        3,
        [&](ddp::inproc::communicator& c) {
          plain_rank(c, data, {{0, 1, 0, 0}, {0, 3, 0, 1}}, unused, result);
        },
        {.max_restarts = 1});
    FAIL("the run went on past max_restarts");
  } catch (const ddp::inproc::launch_error& e) {
    CHECK(e.origin_rank() == 0);
    CHECK(std::string(e.what()).find("injected fault") != std::string::npos);
    CHECK(std::string(e.what()).find("the run ends: it has gone on after 1 lost rank(s) already (max_restarts = 1)") !=
          std::string::npos);
  }
}

namespace {

template <class Update>
void check_growing_back(ddp::optim::adamw opt) {
  const indexed_rows data(rows);
  const auto reference = one_rank_run<ddp::update::replicated, test::mlp>(data, opt);
  const auto dir = fs::temp_directory_path() / ("ddp_elastic_grow_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  // 3 ranks; rank 1 fails in step 5 (a sharded update goes back to the checkpoint saved after
  // step 4: no step is taken twice); 2 ranks join once 5 steps are complete, and 1 more at the
  // next boundary after rank 0 asks for it before step 7 (from inside the run: any thread may).
  ddp::inproc::elastic_control control;
  control.grow(2, 5);
  run_result elastic;
  taken_samples taken;
  const auto report = ddp::inproc::launch_elastic(
      3,
      [&](ddp::inproc::communicator& c) {
        invariant_rank<Update, test::mlp>(c, data, opt, {{1, 4, 0, 0}}, taken, elastic, dir,
                                          [&](const auto& comm, std::uint64_t steps) {
                                            if (comm.rank() == 0 && steps == 6 && comm.size() == 4) control.grow(1);
                                          });
      },
      {.control = &control});
  fs::remove_all(dir);
  REQUIRE(report.changes.size() == 3);
  CHECK(report.changes[0].failed_rank == 1);
  CHECK(report.changes[0].resumed_at == 4);
  CHECK(report.changes[0].new_world == 2);
  CHECK(report.changes[1].failed_rank == -1);
  CHECK(report.changes[1].cause == "2 ranks join");
  CHECK(report.changes[1].joined == 2);
  CHECK(report.changes[1].steps == 5);
  CHECK(report.changes[1].resumed_at == 5);
  CHECK(report.changes[1].old_world == 2);
  CHECK(report.changes[1].new_world == 4);
  CHECK(report.changes[1].survivors == std::vector<int>{0, 1});
  CHECK(report.changes[2].joined == 1);
  // the boundary after the furthest step any rank had begun when rank 0 asked
  CHECK((report.changes[2].steps == 6 || report.changes[2].steps == 7));
  CHECK(report.world_size == 5);
  CHECK(taken.each_once(rows, epochs));
  REQUIRE(elastic.params.size() == 5);
  for (const auto& rank : elastic.params) CHECK(bitwise_equal(rank, reference));
}

}  // namespace

TEST_CASE_TEMPLATE("launch_elastic grows back: ranks join at a step boundary from a peer's state, every sample once, "
                   "the uninterrupted run's bits",
                   Update, ddp::update::replicated, ddp::update::sharded) {
  check_growing_back<Update>(ddp::optim::adamw{.lr = 0.01f});
}

TEST_CASE("launch_elastic: ranks due to join when a rank fails join the survivors at once, and count towards "
          "min_world") {
  const indexed_rows data(rows);
  const ddp::optim::adamw opt{.lr = 0.01f};
  const auto reference = one_rank_run<ddp::update::replicated, test::mlp>(data, opt);
  // 3 ranks, at least 3. Rank 2 fails between steps 3 and 4 (in its own code, before it begins
  // the step), as one rank is due to join there: the others end at that boundary, and the
  // membership that follows has the 2 survivors and the rank that joins.
  const step_hook fail_before_step_4 = [](const ddp::inproc::communicator& c, std::uint64_t steps) {
    if (membership_of(c) == 0 && c.rank() == 2 && steps == 3) throw std::runtime_error("injected fault");
  };
  auto run = [&](ddp::inproc::elastic_control* control, taken_samples& taken, run_result& result) {
    return ddp::inproc::launch_elastic(
        3,
        [&](ddp::inproc::communicator& c) {
          invariant_rank<ddp::update::replicated, test::mlp>(c, data, opt, {}, taken, result, {}, fail_before_step_4);
        },
        {.min_world = 3, .control = control});
  };
  ddp::inproc::elastic_control control;
  control.grow(1, 3);
  run_result elastic;
  taken_samples taken;
  const auto report = run(&control, taken, elastic);
  REQUIRE(report.changes.size() == 1);
  CHECK(report.changes[0].failed_rank == 2);
  CHECK(report.changes[0].joined == 1);
  CHECK(report.changes[0].survivors == std::vector<int>{0, 1});
  CHECK(report.changes[0].new_world == 3);
  CHECK(taken.each_once(rows, epochs));
  REQUIRE(elastic.params.size() == 3);
  for (const auto& rank : elastic.params) CHECK(bitwise_equal(rank, reference));
  // Without the request, 2 ranks are fewer than min_world: the run ends with the failure.
  taken_samples unused;
  run_result ended;
  CHECK_THROWS_WITH_AS(run(nullptr, unused, ended),
                       doctest::Contains("the run ends: 2 rank(s) would go on, fewer than min_world = 3"),
                       ddp::inproc::launch_error);
}

TEST_CASE("launch_elastic: a request for ranks made in the last step of a run that ends in join() ends no "
          "membership (every rank only shadows the boundary), and one made earlier still regroups at its step") {
  // Rank 1 has 3 batches, rank 0 has 4 and asks for a rank in its last step (step 3): the request
  // is due at step 4, which every rank reaches inside join() with nothing to train.
  auto run = [](int ask_in_step) {
    ddp::inproc::elastic_control control;
    std::atomic<int> runs{0};
    const auto report = ddp::inproc::launch_elastic(
        2,
        [&](ddp::inproc::communicator& c) {
          ++runs;
          auto model = test::make_mlp(3);
          ddp::host::device dev;
          ddp::trainer<test::mlp> trainer(model, c, dev, ddp::optim::sgd{.lr = 0.1f});
          const auto batches = static_cast<std::uint64_t>(c.rank() == 0 ? 4 : 3);
          while (trainer.steps() < batches) {
            const auto b = test::make_batch(4, 10 + trainer.steps() + 100 * static_cast<std::uint64_t>(c.rank()));
            trainer.step([&](auto& r) {
              if (c.rank() == 0 && membership_of(c) == 0 && trainer.steps() == static_cast<std::uint64_t>(ask_in_step))
                control.grow(1);
              r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad);
            });
          }
          trainer.join();
        },
        {.control = &control});
    return std::pair{report, runs.load()};
  };
  const auto [in_last, runs_last] = run(3);
  CHECK(in_last.changes.empty());
  CHECK(in_last.world_size == 2);
  CHECK(runs_last == 2);
  // Asked in step 1, the rank joins at step 2, which rank 0 and rank 1 both train.
  const auto [earlier, runs_earlier] = run(1);
  REQUIRE(earlier.changes.size() == 1);
  CHECK(earlier.changes[0].joined == 1);
  CHECK(earlier.changes[0].steps == 2);
  CHECK(earlier.world_size == 3);
}

TEST_CASE("launch_elastic: a program that destroyed an earlier trainer normally hands over after a failure, and "
          "the earlier trainer starts afresh in the next membership") {
  const indexed_rows data(rows);
  const ddp::optim::adamw opt{.lr = 0.01f};
  const auto reference = one_rank_run<ddp::update::replicated, test::mlp>(data, opt);
  run_result elastic;
  taken_samples taken;
  std::atomic<int> earlier_phases{0};
  const auto report = ddp::inproc::launch_elastic(3, [&](ddp::inproc::communicator& c) {
    {  // an earlier phase with a trainer of its own, destroyed normally
      test::mlp warmup = test::make_mlp(3);
      ddp::host::device dev;
      ddp::trainer<test::mlp> first(warmup, c, dev, ddp::optim::sgd{.lr = 0.1f});
      const auto b = test::make_batch(4, 1);
      first.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
      CHECK(first.steps() == 1);  // afresh in every membership
      ++earlier_phases;
    }
    invariant_rank<ddp::update::replicated, test::mlp>(c, data, opt, {{2, 5, 1, 0}}, taken, elastic);
  });
  REQUIRE(report.changes.size() == 1);
  CHECK(report.changes[0].failed_rank == 2);
  CHECK(report.changes[0].resumed_at == report.changes[0].steps);
  CHECK(report.changes[0].steps >= 5);
  CHECK(report.world_size == 2);
  CHECK(earlier_phases == 5);
  CHECK(taken.each_once(rows, epochs));
  REQUIRE(elastic.params.size() == 2);
  for (const auto& rank : elastic.params) CHECK(bitwise_equal(rank, reference));
}

TEST_CASE("launch_elastic under reduction::invariant<8>: a request to grow past 8 ranks is refused when asked, "
          "one that fits is taken") {
  const indexed_rows data(rows);
  const ddp::optim::adamw opt{.lr = 0.01f};
  const auto reference = one_rank_run<ddp::update::replicated, test::mlp>(data, opt);
  ddp::inproc::elastic_control control;
  std::string refused;
  run_result elastic;
  taken_samples taken;
  const auto report = ddp::inproc::launch_elastic(
      6,
      [&](ddp::inproc::communicator& c) {
        invariant_rank<ddp::update::replicated, test::mlp>(
            c, data, opt, {}, taken, elastic, {}, [&](const auto& comm, std::uint64_t steps) {
              if (comm.rank() != 0 || steps != 2 || comm.size() != 6) return;
              try {
                control.grow(3);
              } catch (const std::invalid_argument& e) {
                refused = e.what();
              }
              control.grow(2);
            });
      },
      {.control = &control});
  CHECK(refused ==
        "ddp: elastic grow: 3 ranks more would make a world of 9 ranks, but reduction::invariant<8> holds one virtual "
        "shard at least per rank, so at most 8 ranks: ask for at most 2 more");
  REQUIRE(report.changes.size() == 1);
  CHECK(report.changes[0].joined == 2);
  CHECK(report.world_size == 8);
  CHECK(taken.each_once(rows, epochs));
  REQUIRE(elastic.params.size() == 8);
  for (const auto& rank : elastic.params) CHECK(bitwise_equal(rank, reference));
}

TEST_CASE("launch_elastic grows back under the plain reduction: the rest of the epoch is re-cut for the larger world") {
  // 2 ranks x 4: 12 steps an epoch; from step 5, 3 ranks x 4
  ddp::inproc::elastic_control control;
  control.grow(1, 5);
  const auto report = check_plain_elastic(2, {}, {.control = &control});
  REQUIRE(report.changes.size() == 1);
  CHECK(report.changes[0].steps == 5);
  CHECK(report.world_size == 3);
}

TEST_CASE("a checkpoint saved in the middle of an epoch continues at another world size: the rest of the epoch is "
          "re-cut, every sample once") {
  const indexed_rows data(rows);
  const auto dir = fs::temp_directory_path() / ("ddp_elastic_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  taken_samples taken;
  using trainer_t = ddp::trainer<test::mlp, ddp::bucket_cap<512>>;
  auto part = [&](ddp::inproc::communicator& comm, std::size_t steps, bool resume, std::size_t batch = 4,
                  taken_samples* into = nullptr) {
    test::mlp model = test::make_mlp(3);
    ddp::host::device dev;
    trainer_t trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.1f}, {.seed = 8});
    if (resume) {
      trainer.load(dir);
      trainer.save(dir);  // before the epoch goes on: the same position again,
      trainer.load(dir);  // which this run goes on from
    }
    ddp::data::loader loader(data, batch, &indexed_rows::collate);
    std::size_t done = 0;
    while (trainer.epochs_started() < epochs) {
      const auto epoch = trainer.epochs_started();
      for (const auto& b : trainer.epoch(loader)) {
        trainer.step([&](auto& replica) {
          replica.backward(ddp::nn::softmax_cross_entropy(replica.forward(b.x), b.y, b.weights).grad);
        });
        (into ? *into : taken).add(epoch, real_samples(b));
        if (++done == steps) return trainer.save(dir);
      }
    }
  };
  // 2 ranks take 5 of the first epoch's 12 steps and save; 3 ranks take the rest and the second;
  // 4 ranks after a save in the middle of the second epoch at 3 (an epoch re-cut twice). Each
  // resumed part saves again at once, before its first epoch() call.
  ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) { part(c, 5, false); });
  ddp::inproc::launch(3, [&](ddp::inproc::communicator& c) { part(c, 5 + 3, true); });
  ddp::inproc::launch(4, [&](ddp::inproc::communicator& c) { part(c, 1000, true); });
  CHECK(taken.each_once(rows, epochs));

  // Another batch size, at the same world size and at another: what was taken is counted in the
  // batches of the loader it was saved with.
  fs::remove_all(dir);
  taken_samples resized;
  ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) { part(c, 5, false, 4, &resized); });
  ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) { part(c, 1, true, 8, &resized); });
  ddp::inproc::launch(1, [&](ddp::inproc::communicator& c) { part(c, 1000, true, 16, &resized); });
  CHECK(resized.each_once(rows, epochs));
  fs::remove_all(dir);
}

}  // namespace trainer_elastic_test
