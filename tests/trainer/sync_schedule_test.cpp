// Sync schedules: local steps reduce nothing, syncs bring the replicas together (local SGD's
// average, DiLoCo's outer step on the averaged pseudo-gradient), their state survives a
// checkpoint mid-period bitwise, and they send a fraction of every_step's bytes.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "ddp/data/loader.hpp"
#include "ddp/ddp.hpp"
#include "ddp/host/device.hpp"
#include "ddp/inproc/elastic.hpp"
#include "ddp/inproc/launch.hpp"
#include "trainer/counting_communicator.hpp"
#include "trainer/indexed_rows.hpp"
#include "trainer/test_model.hpp"

namespace trainer_sync_schedule_test {

namespace fs = std::filesystem;

namespace {

using params_t = std::vector<std::vector<float>>;
constexpr std::size_t per_rank = 8;

struct rows : test::toy_dataset {
  explicit rows(std::size_t n) : test::toy_dataset(n, 31) {}
};

// Each rank's batch of step s: its rows of a global batch (the same data at every schedule).
test::batch batch_of(int rank, int world, int step) {
  auto global = test::make_batch(per_rank * static_cast<std::size_t>(world), 500 + static_cast<std::uint64_t>(step));
  const auto r = static_cast<std::size_t>(rank);
  return global.rows(r * per_rank, (r + 1) * per_rank);
}

// `steps` steps of a trainer with `Schedule`; returns each step's parameters on this rank.
template <class Schedule, class Optimizer = ddp::optim::sgd, class Comm>
std::vector<params_t> run(Comm& comm, int steps, Optimizer opt = {.lr = 0.1f}, Schedule schedule = {}) {
  test::mlp model = test::make_mlp(3);
  ddp::host::device dev;
  ddp::trainer<test::mlp, Schedule, Optimizer, ddp::bucket_cap<256>, ddp::use_communicator<Comm>> trainer(model, comm,
                                                                                                       dev, opt);
  trainer.template policy<ddp::sync_schedule::slot>() = schedule;
  std::vector<params_t> after;
  for (int s = 0; s < steps; ++s) {
    const auto b = batch_of(comm.rank(), comm.size(), s);
    trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    after.push_back(test::parameter_values(model));
  }
  return after;
}

double largest_difference(const params_t& a, const params_t& b) {
  double d = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t j = 0; j < a[i].size(); ++j) d = std::max(d, static_cast<double>(std::abs(a[i][j] - b[i][j])));
  return d;
}

const ddp::optim::sgd outer_lr_1{.lr = 1.0f, .momentum = 0.0f, .weight_decay = 0.0f, .nesterov = false};

}  // namespace

TEST_CASE("local_sgd: every rank holds the same parameters after each average, and its own between them") {
  const auto by_rank = ddp::inproc::launch(2, [](ddp::inproc::communicator& c) {
    return run<ddp::sync_schedule::local_sgd<3, 1>>(c, 7);
  });
  // Step 0 is the warm-up (its gradients averaged); steps 1-3 local, averaged after step 3; 4-6.
  for (int s = 0; s < 7; ++s) {
    CAPTURE(s);
    const bool equal = s == 0 || s == 3 || s == 6;
    CHECK((by_rank[0][static_cast<std::size_t>(s)] == by_rank[1][static_cast<std::size_t>(s)]) == equal);
  }
}

TEST_CASE("diloco<1> with outer SGD at lr 1, no momentum, equals every_step to rounding") {
  const auto every = ddp::inproc::launch(2, [](ddp::inproc::communicator& c) {
    return run<ddp::sync_schedule::every_step>(c, 4);
  });
  const auto diloco = ddp::inproc::launch(2, [](ddp::inproc::communicator& c) {
    return run<ddp::sync_schedule::diloco<1>>(c, 4, ddp::optim::sgd{.lr = 0.1f}, {.outer = outer_lr_1});
  });
  for (int r = 0; r < 2; ++r)
    for (int s = 0; s < 4; ++s) {
      CAPTURE(r);
      CAPTURE(s);
      const auto d = largest_difference(diloco[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)],
                                        every[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)]);
      CHECK(d < 1e-6);
    }
}

// The pseudo-gradient is the anchor minus the local parameters: an outer SGD step at lr 1 then
// lands on the average of the ranks' local parameters, which local SGD computes directly. With
// the sign reversed it would land on 2 * anchor - average, far from it.
TEST_CASE("diloco's pseudo-gradient points from the local parameters to the anchor (its sign)") {
  const auto local = ddp::inproc::launch(2, [](ddp::inproc::communicator& c) {
    return run<ddp::sync_schedule::local_sgd<3>>(c, 3);
  });
  const auto diloco = ddp::inproc::launch(2, [](ddp::inproc::communicator& c) {
    return run<ddp::sync_schedule::diloco<3>>(c, 3, ddp::optim::sgd{.lr = 0.1f}, {.outer = outer_lr_1});
  });
  REQUIRE(largest_difference(local[0][1], local[1][1]) > 1e-4);  // the ranks went apart before the sync
  for (int r = 0; r < 2; ++r) CHECK(largest_difference(diloco[static_cast<std::size_t>(r)][2], local[0][2]) < 1e-6);
}

// On one rank the averaged pseudo-gradient is the rank's own: two outer Nesterov steps computed
// by hand from plain inner runs give the same bits.
TEST_CASE("diloco's outer Nesterov momentum over two outer steps, against a hand-computed reference") {
  constexpr int period = 2;
  const ddp::optim::sgd inner{.lr = 0.1f};
  const auto outer = ddp::sync_schedule::nesterov_outer;
  const auto diloco = ddp::inproc::launch(1, [&](ddp::inproc::communicator& c) {
    return run<ddp::sync_schedule::diloco<period>>(c, 2 * period, inner);
  });
  // The reference: plain SGD steps on the same batches, the outer rule by hand between periods.
  test::mlp model = test::make_mlp(3);
  test::reference_sgd opt(model, inner);
  params_t anchor = test::parameter_values(model), momentum = anchor;
  for (auto& m : momentum) std::fill(m.begin(), m.end(), 0.0f);
  for (int s = 0; s < 2 * period; ++s) {
    const auto b = batch_of(0, 1, s);
    model.backward(ddp::nn::softmax_cross_entropy(model.forward(b.x), b.y).grad, ddp::ready_sink{});
    opt.step();
    if ((s + 1) % period) continue;
    auto params = model.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto v = params[i].value.as<float>();
      for (std::size_t j = 0; j < v.size(); ++j) {
        const float d = -(v[j] - anchor[i][j]);  // the pseudo-gradient, as the trainer forms it
        float& m = momentum[i][j];
        m = outer.momentum * m + d;
        anchor[i][j] -= outer.lr * (d + outer.momentum * m);
        v[j] = anchor[i][j];
      }
    }
  }
  CHECK(diloco[0][2 * period - 1] == anchor);
  REQUIRE(largest_difference(anchor, diloco[0][0]) > 1e-4);
}

TEST_CASE("sync schedules send a fraction of every_step's bytes: diloco<4> a quarter") {
  auto bytes = [](auto schedule) {
    return ddp::inproc::launch(2, [&](ddp::inproc::communicator& inner) {
      test::counting_communicator<ddp::inproc::communicator> c(inner);
      run<decltype(schedule)>(c, 8, ddp::optim::sgd{.lr = 0.1f}, schedule);
      return c.bytes().all_reduce;
    })[0];
  };
  const double every = bytes(ddp::sync_schedule::every_step{});
  const double diloco = bytes(ddp::sync_schedule::diloco<4>{});
  const double local = bytes(ddp::sync_schedule::local_sgd<2>{});
  CAPTURE(every);
  CAPTURE(diloco);
  CAPTURE(local);
  // A sync moves each bucket whole, its padding included; a step's reduction its gradients and
  // the control floats: within a percent of each other.
  CHECK(diloco <= every / 4.0 * 1.01);
  CHECK(diloco > every / 4.0 * 0.99);
  CHECK(local <= every / 2.0 * 1.01);
}

TEST_CASE("streaming_diloco with one fragment, no delay and no mixing takes diloco's steps, bitwise") {
  const auto diloco = ddp::inproc::launch(2, [](ddp::inproc::communicator& c) {
    return run<ddp::sync_schedule::diloco<3>>(c, 7);
  });
  const auto streaming = ddp::inproc::launch(2, [](ddp::inproc::communicator& c) {
    return run<ddp::sync_schedule::streaming_diloco<3, 1>>(c, 7);
  });
  CHECK(streaming == diloco);
}

// Two fragments staggered over H = 4, each reduced across one inner step (Delay 1) and applied
// without mixing: fragment 1 starts after step 1 and lands after step 2, fragment 0 after steps
// 3 and 4. Right after a fragment lands, its tensors are equal on every rank and the other's
// are not; the two landings cover every tensor once.
TEST_CASE("streaming_diloco: fragments land in turn, each equal on every rank when it lands") {
  using schedule = ddp::sync_schedule::streaming_diloco<4, 2, 1>;
  schedule s;
  s.mixing = 0.0f;
  const auto by_rank = ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) {
    return run<schedule>(c, 5, ddp::optim::sgd{.lr = 0.1f}, s);
  });
  auto equal_tensors = [&](int step) {
    std::vector<bool> equal;
    const auto& a = by_rank[0][static_cast<std::size_t>(step)];
    const auto& b = by_rank[1][static_cast<std::size_t>(step)];
    for (std::size_t t = 0; t < a.size(); ++t) equal.push_back(a[t] == b[t]);
    return equal;
  };
  const auto second = equal_tensors(2), first = equal_tensors(4);  // the steps counted from 0
  std::size_t covered = 0;
  for (std::size_t t = 0; t < first.size(); ++t) {
    CAPTURE(t);
    CHECK(first[t] != second[t]);  // each tensor in exactly one fragment
    covered += first[t] || second[t];
  }
  CHECK(covered == first.size());
  CHECK(std::count(first.begin(), first.end(), true) > 0);
  CHECK(std::count(second.begin(), second.end(), true) > 0);
}

// A fragment in flight across inner steps (Delay 1) goes through the comm hook, in memory of the
// sync stage's own: under bf16 the syncs send half of f32's bytes (counted beyond what a trainer
// sends before its first step), and land within bf16's rounding of the f32 run (the hook's finish
// widened the averaged pseudo-gradient back).
TEST_CASE("streaming_diloco: fragments in flight go through the comm hook (bf16 halves their bytes)") {
  auto go = [](auto hook, int steps) {
    return ddp::inproc::launch(2, [&](ddp::inproc::communicator& inner) {
      test::counting_communicator<ddp::inproc::communicator> c(inner);
      test::mlp model = test::make_mlp(3);
      ddp::host::device dev;
      ddp::trainer<test::mlp, ddp::sync_schedule::streaming_diloco<4, 2, 1>, decltype(hook), ddp::bucket_cap<256>,
                   ddp::use_communicator<decltype(c)>>
          trainer(model, c, dev, ddp::optim::sgd{.lr = 0.1f});
      for (int s = 0; s < steps; ++s) {
        const auto b = batch_of(c.rank(), c.size(), s);
        trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
      }
      return std::pair{c.bytes().all_reduce, test::parameter_values(model)};
    })[0];
  };
  const auto [f32_bytes, f32_params] = go(ddp::comm_hook::none{}, 8);
  const auto [bf16_bytes, bf16_params] = go(ddp::comm_hook::bf16{}, 8);
  const double f32_before = go(ddp::comm_hook::none{}, 0).first, bf16_before = go(ddp::comm_hook::bf16{}, 0).first;
  REQUIRE(f32_bytes > f32_before);
  CHECK(bf16_bytes - bf16_before == (f32_bytes - f32_before) / 2);
  const double d = largest_difference(bf16_params, f32_params);
  CHECK(d > 0.0);
  CHECK(d < 1e-2);
}

TEST_CASE("streaming_diloco: more fragments than buckets is an error naming both counts") {
  ddp::inproc::launch(1, [](ddp::inproc::communicator& c) {
    test::mlp model = test::make_mlp(1);
    ddp::host::device dev;
    using trainer_t = ddp::trainer<test::mlp, ddp::sync_schedule::streaming_diloco<8, 8>>;  // one 25 MiB bucket
    CHECK_THROWS_WITH_AS(trainer_t(model, c, dev), doctest::Contains("syncs 8 fragments"), ddp::error);
  });
}

// A run stopped mid-period (inner steps taken since the last outer step: each rank's own
// parameters and AdamW state, the anchor, the outer momentum) resumes bitwise.
TEST_CASE("diloco, local_sgd and streaming_diloco: a checkpoint saved mid-period resumes bitwise") {
  const rows data(48);
  auto dir = fs::temp_directory_path() / ("ddp_sync_schedule_test_" + std::to_string(::getpid()));
  auto go = [&](auto schedule, std::size_t steps, std::optional<std::size_t> save_after, bool resume,
                std::uint64_t init) {
    using schedule_t = decltype(schedule);
    return ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) {
      test::mlp model = test::make_mlp(init);
      ddp::host::device dev;
      ddp::trainer<test::mlp, schedule_t, ddp::optim::adamw, ddp::bucket_cap<256>> trainer(
          model, c, dev, ddp::optim::adamw{.lr = 1e-2f}, {.seed = 4});
      if (resume) trainer.load(dir);
      const ddp::data::loader loader(data, 4, &rows::collate);
      while (trainer.steps() < steps)
        for (const auto& b : trainer.epoch(loader)) {
          trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y, b.weights).grad); });
          if (save_after && trainer.steps() == *save_after) trainer.save(dir);
          if (trainer.steps() == steps) break;
        }
      return test::parameter_values(model);
    });
  };
  auto check = [&](auto schedule) {
    fs::remove_all(dir);
    const auto whole = go(schedule, 11, std::nullopt, false, 5);
    go(schedule, 6, 6, false, 5);  // 6 steps: mid-period of 4 (2 inner steps after the outer one at 4)
    const auto resumed = go(schedule, 11, std::nullopt, true, 77);
    CHECK(resumed == whole);
    CHECK(whole[0] != whole[1]);  // mid-period at the end: the ranks differ, and each resumed its own
    fs::remove_all(dir);
  };
  check(ddp::sync_schedule::diloco<4>{});
  check(ddp::sync_schedule::local_sgd<4>{});
  // saved after step 6 with fragment 1 (launched after it) still reducing: applied after step 7
  check(ddp::sync_schedule::streaming_diloco<4, 2, 1>{});
}

// Under launch_elastic a rank lost mid-period costs its own steps since the last sync (the
// others keep theirs); a rank that joins mid-period takes a peer's state, then, under a schedule
// with an anchor, starts from the anchor (the parameters of the last sync), while the survivors
// keep their inner progress; after the next sync every rank holds the same parameters (under
// streaming DiLoCo without mixing: each fragment's tensors, when it lands). Every sample of each
// epoch is taken once across the memberships, and sync_now() at the end leaves every rank equal.
template <class Schedule>
void check_elastic() {
  constexpr std::size_t n = 96, epochs = 2;
  constexpr bool streaming = ddp::sync_schedule::streams_fragments<Schedule>;
  constexpr bool anchored = ddp::sync_schedule::has_outer<Schedule>;
  const test::indexed_rows data(n);
  std::mutex mutex;
  std::map<std::uint64_t, std::multiset<std::size_t>> taken;  // by epoch
  struct record {
    int membership;
    params_t params;
  };
  std::map<std::uint64_t, std::map<int, record>> after;  // every step's parameters: by step count, by rank
  std::map<int, params_t> joined_with, at_end;           // membership 2 (after the join): at its start, at the end
  std::uint64_t join_at = 0;
  ddp::inproc::elastic_control control;
  control.grow(1, 10);  // mid-period: syncs after steps 4, 8, 12, ... (fragments: 3, 5, 7, 9, 11, ...)
  const auto report = ddp::inproc::launch_elastic(
      3,
      [&](ddp::inproc::communicator& c) {
        test::mlp model = test::make_mlp(3);
        ddp::host::device dev;
        ddp::trainer<test::mlp, Schedule, ddp::optim::adamw, ddp::bucket_cap<256>> trainer(
            model, c, dev, ddp::optim::adamw{.lr = 0.01f}, {.seed = 8});
        ddp::data::loader loader(data, 4, &test::indexed_rows::collate);
        const auto h = c.handoff();
        const int membership = h ? h.shared().restarts() : 0;
        if (membership == 2) {
          std::lock_guard lock(mutex);
          joined_with[c.rank()] = test::parameter_values(model);
          join_at = trainer.steps();
        }
        while (trainer.epochs_started() < epochs) {
          const std::uint64_t epoch = trainer.epochs_started();
          for (const auto& b : trainer.epoch(loader)) {
            if (membership == 0 && c.rank() == 1 && trainer.steps() == 6) throw std::runtime_error("injected fault");
            trainer.step([&](auto& r) {
              r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y, b.weights).grad);
            });
            std::lock_guard lock(mutex);
            const auto mine = test::real_samples(b);
            taken[epoch].insert(mine.begin(), mine.end());
            after[trainer.steps()][c.rank()] = {membership, test::parameter_values(model)};
          }
        }
        trainer.sync_now();
        std::lock_guard lock(mutex);
        at_end[c.rank()] = test::parameter_values(model);
      },
      {.control = &control});
  REQUIRE(report.changes.size() == 2);
  CHECK(report.changes[0].failed_rank == 1);
  CHECK(report.changes[1].joined == 1);
  CHECK(report.world_size == 3);
  std::multiset<std::size_t> all;
  for (std::size_t i = 0; i < n; ++i) all.insert(i);
  REQUIRE(taken.size() == epochs);
  for (const auto& [epoch, samples] : taken) CHECK(samples == all);

  // Which tensors are equal on every rank that completed step `steps` (none for fewer than 2 ranks).
  auto equal_tensors = [&](std::uint64_t steps) {
    const auto& by_rank = after.at(steps);
    const auto& first = by_rank.begin()->second.params;
    std::vector<bool> equal(first.size(), by_rank.size() >= 2);
    for (const auto& [rank, r] : by_rank)
      for (std::size_t t = 0; t < first.size(); ++t) equal[t] = equal[t] && r.params[t] == first[t];
    return equal;
  };
  bool after_join = false;
  if constexpr (!streaming) {
    for (const auto& entry : after)
      if (const std::uint64_t steps = entry.first; steps % 4 == 0) {
        const auto& by_rank = entry.second;
        CAPTURE(steps);
        for (const auto& [rank, r] : by_rank) CHECK(r.params == by_rank.begin()->second.params);
        after_join = after_join || (steps > 10 && by_rank.size() == 3);
      }
  } else {
    // Fragment 0 lands after steps 5, 9, ... (phase 1), fragment 1 after 3, 7, 11 (phase 3): each
    // landing whose launch, a step before, was in the same membership (a hand-over drops the
    // fragments in flight) leaves that fragment's tensors, and only them, equal on every rank.
    std::map<std::uint64_t, std::vector<bool>> landed;  // by phase
    for (const auto& entry : after) {
      const std::uint64_t steps = entry.first;
      const auto& by_rank = entry.second;
      if (steps % 2 == 0 || steps < 3) continue;
      bool launched_here = after.count(steps - 1) != 0;
      for (const auto& [rank, r] : by_rank)
        launched_here = launched_here && after.at(steps - 1).count(rank) &&
                        after.at(steps - 1).at(rank).membership == r.membership;
      if (!launched_here || by_rank.size() < 2) continue;
      CAPTURE(steps);
      const auto equal = equal_tensors(steps);
      const auto it = landed.emplace(steps % 4, equal).first;
      CHECK(it->second == equal);
      after_join = after_join || (steps > 10 && by_rank.size() == 3);
    }
    REQUIRE(landed.size() == 2);
    for (std::size_t t = 0; t < landed[1].size(); ++t) CHECK(landed[1][t] != landed[3][t]);
  }
  CHECK(after_join);

  // The join: the survivors (ranks 0 and 1) go on from their own parameters; the joiner from the
  // anchor, each tensor's value where it was last equal on every rank (its last sync), or, without
  // an anchor, from its peer's (rank 2 % 2 survivors: rank 0's).
  REQUIRE(joined_with.size() == 3);
  for (int r = 0; r < 2; ++r) CHECK(joined_with[r] == after.at(join_at).at(r).params);
  const auto& joiner = joined_with[2];
  if constexpr (!anchored) {
    CHECK(joiner == after.at(join_at).at(0).params);
  } else {
    for (std::size_t t = 0; t < joiner.size(); ++t) {
      CAPTURE(t);
      std::optional<std::uint64_t> last_sync;
      for (const auto& entry : after)
        if (entry.first <= join_at && equal_tensors(entry.first)[t]) last_sync = entry.first;
      REQUIRE(last_sync);
      CHECK(joiner[t] == after.at(*last_sync).begin()->second.params[t]);
      CHECK(joiner[t] != after.at(join_at).at(0).params[t]);  // not a survivor's inner progress
    }
  }
  // sync_now() after the last epoch: every rank leaves with the same parameters.
  REQUIRE(at_end.size() == 3);
  for (const auto& [rank, p] : at_end) CHECK(p == at_end.begin()->second);
}

// Two fragments, each reduced across one inner step, landing without mixing (set before the
// trainer is built: a hand-over's state is loaded there, and names the mixing it was saved with).
struct streaming_unmixed : ddp::sync_schedule::streaming_diloco<4, 2, 1> {
  streaming_unmixed() { mixing = 0.0f; }
};

TEST_CASE_TEMPLATE("sync schedules under launch_elastic: a rank lost and one joining mid-period, every sample once, "
                   "every rank equal after each sync",
                   Schedule, ddp::sync_schedule::diloco<4>, ddp::sync_schedule::local_sgd<4>, streaming_unmixed) {
  check_elastic<Schedule>();
}

// `steps` steps, then sync_now(); returns each rank's parameters before and after it.
template <class Schedule>
std::pair<params_t, params_t> run_then_sync(ddp::inproc::communicator& c, int steps, Schedule schedule = {}) {
  test::mlp model = test::make_mlp(3);
  ddp::host::device dev;
  ddp::trainer<test::mlp, Schedule, ddp::optim::sgd, ddp::bucket_cap<256>> trainer(model, c, dev, {.lr = 0.1f});
  trainer.template policy<ddp::sync_schedule::slot>() = schedule;
  for (int s = 0; s < steps; ++s) {
    const auto b = batch_of(c.rank(), c.size(), s);
    trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
  }
  const auto before = test::parameter_values(model);
  trainer.sync_now();
  return {before, test::parameter_values(model)};
}

// A run that ends mid-period (6 steps, a period of 4) takes its pending sync at once: the ranks,
// apart before, leave equal. diloco's outer SGD at lr 1 lands on local SGD's average; streaming
// DiLoCo syncs every fragment, the one still in flight included.
TEST_CASE("sync_now: a run that ends mid-period leaves every rank with the synchronised parameters") {
  auto check = [](auto schedule, int steps) {
    return ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) { return run_then_sync(c, steps, schedule); });
  };
  const auto local = check(ddp::sync_schedule::local_sgd<4>{}, 6);
  const auto diloco = check(ddp::sync_schedule::diloco<4>{.outer = outer_lr_1}, 6);
  const auto nesterov = check(ddp::sync_schedule::diloco<4>{}, 6);
  const auto streaming = check(ddp::sync_schedule::streaming_diloco<4, 2, 1>{}, 6);  // fragment 1 in flight
  for (const auto* r : {&local, &diloco, &nesterov, &streaming}) {
    REQUIRE(largest_difference((*r)[0].first, (*r)[1].first) > 1e-4);  // apart before
    CHECK((*r)[0].second == (*r)[1].second);                           // equal after
  }
  CHECK(largest_difference(diloco[0].second, local[0].second) < 1e-6);
}

// Nothing to sync: every_step's ranks are always equal, and a run that ends on a sync (8 steps, a
// period of 4) or before any step holds the synchronised parameters already. sync_now changes no bit
// (an outer Nesterov step on a zero pseudo-gradient would still move them by the momentum).
TEST_CASE("sync_now: nothing under every_step, at the end of a period, or before the first step") {
  auto unchanged = [](auto schedule, int steps) {
    const auto by_rank =
        ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) { return run_then_sync(c, steps, schedule); });
    return by_rank[0].first == by_rank[0].second && by_rank[1].first == by_rank[1].second;
  };
  CHECK(unchanged(ddp::sync_schedule::every_step{}, 3));
  CHECK(unchanged(ddp::sync_schedule::diloco<4>{}, 8));
  CHECK(unchanged(ddp::sync_schedule::local_sgd<4>{}, 8));
  CHECK(unchanged(ddp::sync_schedule::diloco<4>{}, 0));
  CHECK(unchanged(ddp::sync_schedule::local_sgd<4, 3>{}, 2));  // in the warm-up: every step averaged
  CHECK_FALSE(unchanged(ddp::sync_schedule::diloco<4>{}, 7));
}

// A checkpoint saved before the first step holds no anchor yet: the loading trainer takes it at
// its own first step, from the loaded parameters, as the saving one does.
TEST_CASE("diloco: a checkpoint saved before the first step resumes bitwise") {
  auto dir = fs::temp_directory_path() / ("ddp_sync_schedule_first_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto go = [&](std::uint64_t init, bool save, bool load) {
    return ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) {
      test::mlp model = test::make_mlp(init);
      ddp::host::device dev;
      ddp::trainer<test::mlp, ddp::sync_schedule::diloco<2>, ddp::bucket_cap<256>> trainer(model, c, dev, {.lr = 0.1f});
      if (save) trainer.save(dir);
      if (load) trainer.load(dir);
      for (int s = 0; s < 4; ++s) {
        const auto b = batch_of(c.rank(), c.size(), s);
        trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
      }
      return test::parameter_values(model);
    });
  };
  const auto whole = go(3, true, false);
  CHECK(go(77, false, true) == whole);
  fs::remove_all(dir);
}

// Without a buffer sync nothing is collective between syncs: the survivors learn of the lost rank
// in the sync after step 7, which fails. That step's update stands and counts (the run goes on
// from 8 steps, not 7, so no step is taken twice), and after the next sync every rank is equal.
TEST_CASE("local_sgd without a buffer sync: a sync that fails for a lost peer leaves its step counted") {
  const test::indexed_rows data(96);
  std::mutex mutex;
  std::map<std::uint64_t, std::map<int, params_t>> after_sync;
  const auto report = ddp::inproc::launch_elastic(3, [&](ddp::inproc::communicator& c) {
    test::mlp model = test::make_mlp(3);
    ddp::host::device dev;
    ddp::trainer<test::mlp, ddp::sync_schedule::local_sgd<4>, ddp::buffer_sync::none, ddp::bucket_cap<512>> trainer(
        model, c, dev, ddp::optim::sgd{.lr = 0.1f}, {.seed = 8});
    ddp::data::loader loader(data, 4, &test::indexed_rows::collate);
    const auto h = c.handoff();
    const int membership = h ? h.shared().restarts() : 0;
    while (trainer.steps() < 16)
      for (const auto& b : trainer.epoch(loader)) {
        if (membership == 0 && c.rank() == 1 && trainer.steps() == 6) throw std::runtime_error("injected fault");
        trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y, b.weights).grad); });
        std::lock_guard lock(mutex);
        if (trainer.steps() % 4 == 0) after_sync[trainer.steps()][c.rank()] = test::parameter_values(model);
        if (trainer.steps() == 16) break;
      }
  });
  REQUIRE(report.changes.size() == 1);
  CHECK(report.changes[0].failed_rank == 1);
  CHECK(report.changes[0].resumed_at == 8);
  REQUIRE(after_sync.count(12) == 1);
  CHECK(after_sync[12].size() == 2);
  for (const auto& [rank, p] : after_sync[12]) CHECK(p == after_sync[12].begin()->second);
}

TEST_CASE("a checkpoint of one sync schedule is refused by another, naming both") {
  const rows data(16);
  auto dir = fs::temp_directory_path() / ("ddp_sync_schedule_refuse_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ddp::inproc::launch(1, [&](ddp::inproc::communicator& c) {
    test::mlp model = test::make_mlp(1);
    ddp::host::device dev;
    ddp::trainer<test::mlp, ddp::sync_schedule::diloco<4>> t(model, c, dev, ddp::optim::sgd{.lr = 0.1f});
    t.save(dir);
  });
  ddp::inproc::launch(1, [&](ddp::inproc::communicator& c) {
    test::mlp model = test::make_mlp(1);
    ddp::host::device dev;
    ddp::trainer<test::mlp> t(model, c, dev, ddp::optim::sgd{.lr = 0.1f});
    try {
      t.load(dir);
      FAIL("loaded a diloco checkpoint into an every_step trainer");
    } catch (const ddp::error& e) {
      CHECK(std::string(e.what()).find("diloco") != std::string::npos);
    }
  });
  fs::remove_all(dir);
}

}  // namespace trainer_sync_schedule_test
