#pragma once
// In-process ranks that lose a rank and go on (docs/elastic.md). launch_elastic runs fn on N
// ranks, as launch does; when a rank fails (it throws, or its device reports an error), each
// rank that remains hands over its trainers' state of the last completed step, and fn runs
// again on those ranks alone, renumbered in their old order: each trainer built there starts
// from the handed-over state, and its next epoch continues the interrupted one with the samples
// not yet taken. A failure that every rank raised alike (a collective_error: a checkpoint that
// cannot be loaded, mismatched options) is no lost rank and ends the run, as launch does.
// Ranks join at a step boundary (elastic_control::grow): every rank ends its membership there,
// hands over its state, and fn runs on the larger one, the new ranks starting from a peer's state.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/comm/handoff.hpp"
#include "ddp/inproc/launch.hpp"

namespace ddp::inproc {

// Asks a running launch_elastic for more ranks (a device that came back, a replacement): they
// join at a step boundary, and each starts from a peer's state. Any thread may call it, fn
// included; it must outlive the launch_elastic it is given to.
class elastic_control {
 public:
  // `ranks` more ranks join once the run has completed `steps` steps, or at the next step
  // boundary that no rank has passed if it already has (std::nullopt: the next one).
  // Asked while no run is going, it applies to the next launch_elastic given this control.
  void grow(int ranks, std::optional<std::uint64_t> steps = std::nullopt) {
    elastic::handoff::require_ranks(ranks);
    std::lock_guard lock(mutex_);
    if (handoff_) handoff_->grow(ranks, steps);
    else early_.push_back({ranks, steps});
  }

  // launch_elastic's: requests go to the run's hand-over while it runs (nullptr: it ended).
  void attach(elastic::handoff* h) noexcept {
    std::lock_guard lock(mutex_);
    handoff_ = h;
    if (!h) return;
    for (const auto& [ranks, steps] : early_) h->grow(ranks, steps);  // checked when asked: cannot throw
    early_.clear();
  }

 private:
  std::mutex mutex_;
  elastic::handoff* handoff_ = nullptr;
  std::vector<std::pair<int, std::optional<std::uint64_t>>> early_;  // asked before the run began
};

struct elastic_options {
  // Failures the run survives (ranks joining do not count); the one after the last ends the run.
  int max_restarts = 3;
  // The run ends rather than go on with fewer ranks than this (ranks that join at once count).
  int min_world = 1;
  options world{};
  // Where requests for more ranks come from (none: the membership only shrinks).
  elastic_control* control = nullptr;
};

// One membership change: who failed and why (or who joined), where the run was, and how long the
// hand-over took.
struct membership_change {
  int failed_rank = -1;          // in the old membership; -1 when ranks only joined
  std::string cause;             // its error, or why it ended ("2 ranks join")
  std::vector<int> failed_ranks;     // every rank lost at once, in the old membership (failed_rank first)
  std::vector<std::string> causes;   // the error of each, in the same order
  int joined = 0;                // ranks that joined: new_world - survivors
  std::uint64_t steps = 0;       // steps completed when it failed
  std::uint64_t resumed_at = 0;  // the step the new membership goes on from: `steps`, or under a
                                 // sharded update the last checkpoint's (`checkpoint`)
  std::string checkpoint;        // the directory a sharded update fell back to ("" when none)
  int old_world = 0, new_world = 0;
  std::vector<int> survivors;    // their old ranks, in the order of their new ones
  std::chrono::microseconds to_restart{0};  // from the failure (or the boundary) to the new membership's start
};

struct elastic_report {
  int world_size = 0;  // of the membership that finished
  std::vector<membership_change> changes;
};

namespace launch_detail {

// How a rank's run of fn ended: it returned; it ended its membership for ranks to join
// (elastic::regroup); a peer's failure reached it (peer_error); or it failed on its own.
enum class ending { returned, regrouped, peer_failed, failed };

template <class Outcomes>
ending ending_of(const Outcomes& out, int rank) {
  const auto& e = out.failures[static_cast<std::size_t>(rank)];
  if (!e) return ending::returned;
  try {
    std::rethrow_exception(e);
  } catch (const peer_error&) {
    return ending::peer_failed;
  } catch (const elastic::regroup&) {
    return ending::regrouped;
  } catch (...) {
    return ending::failed;
  }
}

// A rank failed on its own (the origin, or any rank whose error is not a peer's failure, nor
// the end of its membership for ranks to join).
template <class Outcomes>
bool failed_on_its_own(const Outcomes& out, int rank) {
  return ending_of(out, rank) == ending::failed;
}

// Every rank ended its membership at a step boundary for ranks to join.
template <class Outcomes>
bool all_regrouped(const Outcomes& out) {
  for (int r = 0; r < static_cast<int>(out.failures.size()); ++r)
    if (ending_of(out, r) != ending::regrouped) return false;
  return true;
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
  struct detach {
    elastic_control* c;
    ~detach() {
      if (c) c->attach(nullptr);
    }
  } detached{opts.control};
  if (opts.control) opts.control->attach(&handoff);
  elastic_report report;
  int world = world_size;
  int lost = 0;  // memberships that ended with a failure
  for (;;) {
    auto out = launch_detail::run_ranks(world, fn, opts.world, &handoff);
    if (!out.failed()) {
      report.world_size = world;
      return report;
    }
    const auto boundary = std::chrono::steady_clock::now();
    const auto regrouped_at = handoff.regrouped_at();  // read before carry_over resets it
    std::vector<int> survivors;
    membership_change change;
    change.old_world = world;
    const bool grows = launch_detail::all_regrouped(out);
    if (grows) {
      for (int r = 0; r < world; ++r) survivors.push_back(r);
    } else {
      const int origin = out.origin();
      std::string returned;  // ranks whose fn had already returned: their training is over
      change.failed_ranks.push_back(origin);
      for (int r = 0; r < world; ++r) {
        if (r == origin) continue;
        if (launch_detail::failed_on_its_own(out, r)) change.failed_ranks.push_back(r);
        else survivors.push_back(r);
        if (launch_detail::ending_of(out, r) == launch_detail::ending::returned)
          returned += (returned.empty() ? "" : ", ") + std::to_string(r);
      }
      if (survivors.empty() || !launch_detail::failed_on_its_own(out, origin)) out.throw_launch_error();
      if (!returned.empty())
        out.throw_launch_error("rank(s) " + returned + " had returned from the function (their training done) when rank " +
                               std::to_string(origin) + " failed; a failure after a rank's last step ends the run");
      if (lost >= opts.max_restarts)
        out.throw_launch_error("it has gone on after " + std::to_string(lost) + " lost rank(s) already (max_restarts = " +
                               std::to_string(opts.max_restarts) + ")");
      ++lost;
      change.failed_rank = origin;
      change.cause = out.message_of(origin);
      for (int r : change.failed_ranks) change.causes.push_back(out.message_of(r));
    }
    elastic::carried_over carried;
    auto why = handoff.carry_over(survivors, carried);
    if (!why && grows && carried.joined == 0) why = "no request for ranks was due where the membership ended";
    // Ranks that join now count towards min_world.
    if (const int left = static_cast<int>(survivors.size()) + carried.joined; !why && !grows && left < opts.min_world)
      out.throw_launch_error(std::to_string(left) + " rank(s) would go on, fewer than min_world = " +
                             std::to_string(opts.min_world));
    if (why) {
      if (grows) throw error("inproc", "launch_elastic", 0, "ranks cannot join: " + *why);
      try {
        out.throw_launch_error();
      } catch (const launch_error& e) {
        std::throw_with_nested(error("inproc", "launch_elastic", change.failed_rank,
                                     "the run cannot go on without rank " + std::to_string(change.failed_rank) + ": " +
                                         *why + ". The failure: " + e.what()));
      }
    }
    change.joined = carried.joined;
    if (change.failed_rank < 0)
      change.cause = std::to_string(change.joined) + (change.joined == 1 ? " rank joins" : " ranks join");
    change.new_world = static_cast<int>(survivors.size()) + change.joined;
    change.survivors = std::move(survivors);
    change.steps = carried.completed;
    change.resumed_at = carried.resumed_at;
    if (carried.checkpoint) change.checkpoint = carried.checkpoint->dir;
    change.to_restart = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - out.world->failed_at().value_or(regrouped_at.value_or(boundary)));
    world = change.new_world;
    report.changes.push_back(std::move(change));
  }
}

}  // namespace ddp::inproc
