#pragma once
// In-process ranks that lose a rank and go on (docs/elastic.md). launch_elastic runs fn on N
// ranks, as launch does; when a rank fails (it throws, or its device reports an error), each
// rank that remains hands over its trainers' state of the last completed step, and fn runs
// again on those ranks alone, renumbered in their old order: each trainer built there starts
// from the handed-over state, and its next epoch continues the interrupted one with the samples
// not yet taken. A failure that every rank raised alike (a collective_error: a non-finite
// gradient, a checkpoint that cannot be loaded) is no lost rank and ends the run, as launch does.
#include <chrono>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "ddp/comm/handoff.hpp"
#include "ddp/inproc/launch.hpp"

namespace ddp::inproc {

struct elastic_options {
  // Membership changes allowed; the failure after the last one ends the run.
  int max_restarts = 3;
  // The run ends rather than go on with fewer ranks than this.
  int min_world = 1;
  options world{};
};

// One lost membership: who failed, why, where the run was, and how long the hand-over took.
struct membership_change {
  int failed_rank = -1;          // in the old membership
  std::string cause;             // its error
  std::uint64_t steps = 0;       // steps completed when it failed
  std::uint64_t resumed_at = 0;  // the step the new membership goes on from: `steps`, or under a
                                 // sharded update the last checkpoint's (`checkpoint`)
  std::string checkpoint;        // the directory a sharded update fell back to ("" when none)
  int old_world = 0, new_world = 0;
  std::vector<int> survivors;    // their old ranks, in the order of their new ones
  std::chrono::microseconds to_restart{0};  // from the failure to the new membership's start
};

struct elastic_report {
  int world_size = 0;  // of the membership that finished
  std::vector<membership_change> changes;
};

namespace launch_detail {

// A rank failed on its own (the origin, or any rank whose error is not a peer's failure).
template <class Outcomes>
bool failed_on_its_own(const Outcomes& out, int rank) {
  const auto& e = out.failures[static_cast<std::size_t>(rank)];
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const peer_error&) {
    return false;
  } catch (...) {
    return true;
  }
}

}  // namespace launch_detail

// fn(communicator&) on `world_size` ranks, restarted on the ranks that remain after each failure
// (at most opts.max_restarts times). Returns what changed; throws launch_error as launch does
// when the run ends with a failure, or a ddp::error saying why the ranks that remain cannot go on
// (the launch_error nested in it).
template <class F>
elastic_report launch_elastic(int world_size, F&& fn, elastic_options opts = {}) {
  static_assert(std::is_void_v<std::invoke_result_t<F&, communicator&>>,
                "ddp: launch_elastic runs a function returning void (a membership may end early; keep results in "
                "the trainer's state or outside the function)");
  elastic::handoff handoff(world_size);
  elastic_report report;
  int world = world_size;
  for (;;) {
    auto out = launch_detail::run_ranks(world, fn, opts.world, &handoff);
    if (!out.failed()) {
      report.world_size = world;
      return report;
    }
    const int origin = out.origin();
    std::vector<int> survivors;
    for (int r = 0; r < world; ++r)
      if (r != origin && !launch_detail::failed_on_its_own(out, r)) survivors.push_back(r);
    if (survivors.empty() || static_cast<int>(survivors.size()) < opts.min_world ||
        handoff.restarts() >= opts.max_restarts || !launch_detail::failed_on_its_own(out, origin))
      out.throw_launch_error();
    membership_change change{origin, out.message_of(origin), 0, 0, {}, world, static_cast<int>(survivors.size()),
                             survivors, {}};
    elastic::carried_over carried;
    const auto why = handoff.carry_over(survivors, carried);
    if (why) {
      try {
        out.throw_launch_error();
      } catch (const launch_error& e) {
        std::throw_with_nested(error("inproc", "launch_elastic", origin,
                                     "the run cannot go on without rank " + std::to_string(origin) + ": " + *why +
                                         ". The failure: " + e.what()));
      }
    }
    change.steps = carried.completed;
    change.resumed_at = carried.resumed_at;
    if (carried.checkpoint) change.checkpoint = carried.checkpoint->dir;
    change.to_restart = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - out.world->failed_at().value_or(std::chrono::steady_clock::now()));
    report.changes.push_back(std::move(change));
    world = static_cast<int>(survivors.size());
  }
}

}  // namespace ddp::inproc
