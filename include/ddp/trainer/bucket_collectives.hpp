#pragma once
// The collectives in flight on one bucket, apart from its memory (bucket.hpp): the gradients'
// reduction (the hook's first collective and its further ones), the control floats' own, the
// all_gather of the updated shards, and, when the parameters are kept as shards, the gathering
// of the bucket for its layers (the one in flight, and those waited for in this step). They are
// waited for, drained after a failure, read back for a stream backend's failure and let go at the
// step's end together.
#include <optional>
#include <utility>
#include <vector>

#include "ddp/concepts/work.hpp"

namespace ddp::detail {

template <class Work>
class bucket_collectives {
 public:
  // ---- the gradients' reduction ---------------------------------------------------------------

  void add_reduction(Work w) {
    if (!reduction_) reduction_.emplace(std::move(w));
    else more_.push_back(std::move(w));
  }
  // The first of them, when one went out.
  const std::optional<Work>& reduction() const noexcept { return reduction_; }
  void wait_reduction() {
    if (reduction_) reduction_->wait();
    for (auto& w : more_) w.wait();
  }
  // Hands them over (a sync held across steps keeps its own), in the order they went out.
  std::vector<Work> take_reduction() {
    std::vector<Work> out;
    if (reduction_) out.push_back(std::move(*reduction_));
    for (auto& w : more_) out.push_back(std::move(w));
    reduction_.reset(), more_.clear();
    return out;
  }
  void start_control(Work w) { control_.emplace(std::move(w)); }
  void wait_control() {
    if (control_) control_->wait();
  }

  // ---- the parameters -------------------------------------------------------------------------

  // The updated shards' all_gather, after the update.
  void start_update_gather(Work w) { update_gather_.emplace(std::move(w)); }
  // Waits for it; false when none went out.
  bool wait_update_gather() {
    if (!update_gather_) return false;
    update_gather_->wait();
    return true;
  }
  // The bucket gathered for its layers (parameters kept as shards).
  void start_layer_gather(Work w) { layer_gather_.emplace(std::move(w)); }
  // Waits for it, if one is in flight; kept until clear(), so that a stream backend's failure of
  // it is still read after the step.
  void wait_layer_gather() {
    if (!layer_gather_) return;
    layer_gathers_done_.push_back(std::move(*layer_gather_));
    layer_gather_.reset();
    layer_gathers_done_.back().wait();
  }

  // ---- all of them ----------------------------------------------------------------------------

  // A stream backend's failure that aborted one of them (ddp::rethrow_failure): after the host
  // has synchronised with the device.
  void rethrow_failures() const {
    for (const auto* w : {&reduction_, &control_, &update_gather_, &layer_gather_})
      if (*w) rethrow_failure(**w);
    for (const auto& w : more_) rethrow_failure(w);
    for (const auto& w : layer_gathers_done_) rethrow_failure(w);
  }
  // Waits for every one in flight, ignoring failures (a step that failed half-way). A stream
  // backend's wait() only orders the compute stream: the device's deallocate then waits for the
  // GPU before the memory goes.
  void drain() noexcept {
    auto quietly = [](Work& w) {
      try {
        w.wait();
      } catch (...) {
      }
    };
    for (auto* w : {&reduction_, &control_, &update_gather_, &layer_gather_})
      if (*w) quietly(**w);
    for (auto& w : more_) quietly(w);
  }
  // The step's end: a layer gather in flight stays (the reducer waits for it when it releases
  // the values).
  void clear() {
    reduction_.reset(), more_.clear(), control_.reset(), update_gather_.reset();
    layer_gathers_done_.clear();
  }

 private:
  std::optional<Work> reduction_;         // the gradients' reduction (the hook's first collective)
  std::vector<Work> more_;                // the hook's further collectives in this step
  std::optional<Work> control_;           // the control floats', when not part of the reduction
  std::optional<Work> update_gather_;     // the updated shards' all_gather
  std::optional<Work> layer_gather_;      // parameters kept as shards: the bucket's gathering in flight
  std::vector<Work> layer_gathers_done_;  // ... and those waited for in this step
};

}  // namespace ddp::detail
