#pragma once
// What the trainer observes of its own steps: the phases into an attached timeline (nothing is
// recorded, and no clock read, without one) and how much of the last step's reduction ran while
// backward still ran (overlap_timing, from the work handles that know when they ran).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/concepts/work.hpp"
#include "ddp/policy/comm_hook.hpp"
#include "ddp/trainer/metrics.hpp"
#include "ddp/trainer/timeline.hpp"

namespace ddp::detail {

class step_observer {
 public:
  using clock = std::chrono::steady_clock;

  // `f(steps)` runs once, when the next update has completed (elastic training's report of a
  // membership's first step).
  void on_next_update(std::function<void(std::uint64_t steps)> f) { next_update_ = std::move(f); }
  void updated(std::uint64_t step) const {
    if (!next_update_) [[likely]]
      return;
    auto f = std::move(next_update_);
    next_update_ = nullptr;
    f(step + 1);
  }

  // `f(steps)` runs as each step begins (its first micro-batch, or a shadow step), `steps`
  // completed before it; it may throw, and the step does not begin (elastic training ends a
  // membership there for ranks to join). Several run in the order they were given. `shadow`: a
  // round of join(), in which this rank has nothing of its own to train.
  void on_step_begin(std::function<void(std::uint64_t steps, bool shadow)> f) {
    if (step_begins_)
      f = [first = std::move(step_begins_), then = std::move(f)](std::uint64_t steps, bool shadow) {
        first(steps, shadow), then(steps, shadow);
      };
    step_begins_ = std::move(f);
  }
  void step_begins(std::uint64_t steps, bool shadow = false) const {
    if (step_begins_) [[unlikely]]
      step_begins_(steps, shadow);
  }

  // Records every following step's phases into `t` (nullptr stops); `t` must outlive it.
  void record_into(timeline* t) noexcept { timeline_ = t; }
  // One phase of step `step`, from now until the span goes.
  timeline_span phase(const char* name, std::uint64_t step) const noexcept { return {timeline_, name, step}; }
  timeline_span phase_if(bool when, const char* name, std::uint64_t step) const noexcept {
    return {when ? timeline_ : nullptr, name, step};
  }

  clock::time_point launch_begins() const { return timeline_ ? clock::now() : clock::time_point{}; }
  void launched(std::size_t bucket, std::size_t buckets, clock::time_point began, std::uint64_t step) {
    if (!timeline_) return;
    launched_.resize(buckets);
    launched_[bucket] = clock::now();
    timeline_->record("bucket " + std::to_string(bucket) + " pack, launch", timeline_track::step, step, began,
                      launched_[bucket]);
  }
  void backward_finished() { backward_done_ = clock::now(); }

  // Every bucket's reduction is complete: each one on the collectives track (when it ran, from a
  // work handle that knows, else from its launch to now).
  template <class Buckets>
  void record_reductions(const Buckets& buckets, std::uint64_t step, std::string_view update, std::string_view hook) {
    if (!timeline_) return;
    const auto seen = clock::now();
    launched_.resize(std::size(buckets), seen);  // a timeline attached in the middle of this step
    std::size_t b = 0;
    for (const auto& bk : buckets) {
      auto begin = launched_[b], end = seen;
      std::string name = "bucket " + std::to_string(b++) + " " + std::string(update) + " reduction";
      if (!hook.empty()) name += " (" + std::string(hook) + ")";
      using work_type = typename std::remove_cvref_t<decltype(bk.reduction())>::value_type;
      if constexpr (timed_work_handle<work_type>) {
        if (!bk.reduction()) continue;  // a hook that kept this bucket's gradients local
        begin = bk.reduction()->started(), end = bk.reduction()->finished();
      } else {
        name += " (launch to wait)";
      }
      timeline_->record(std::move(name), timeline_track::collectives, step, begin, end);
    }
  }

  // The overlap figures of a step this rank ran (not a shadow or a captured step).
  template <class Buckets>
  void measure_overlap(const Buckets& buckets) {
    overlap_ = {};
    for (const auto& bk : buckets) {
      using work_type = typename std::remove_cvref_t<decltype(bk.reduction())>::value_type;
      if constexpr (timed_work_handle<work_type>) {
        overlap_.measured = true;
        if (!bk.reduction()) continue;
        const auto start = bk.reduction()->started(), finish = bk.reduction()->finished();
        overlap_.reduction_seconds += std::chrono::duration<double>(finish - start).count();
        const auto cut = std::min(finish, backward_done_);
        if (cut > start) overlap_.overlapped_seconds += std::chrono::duration<double>(cut - start).count();
      }
    }
  }

  const overlap_timing& overlap() const noexcept { return overlap_; }

 private:
  timeline* timeline_ = nullptr;
  mutable std::function<void(std::uint64_t)> next_update_;  // one-shot: updated() is called on a const observer
  std::function<void(std::uint64_t, bool)> step_begins_;
  std::vector<clock::time_point> launched_;  // per bucket, while a timeline records
  clock::time_point backward_done_{};
  overlap_timing overlap_;
};

}  // namespace ddp::detail
