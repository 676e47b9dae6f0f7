#pragma once
// The sync schedule's part of a step (ddp/policy/sync_schedule.hpp): which steps reduce their
// gradients, and the sync after an update. Owns what a schedule keeps between syncs: the anchor
// (the parameters after the last outer step, in bucket layout) and the outer optimizer's state,
// and the count of outer steps taken.
//
//   local step    the reducer launches no collective (gradient_reducer::set_local): each rank
//                 updates with its own gradients
//   average       every bucket's f32 values packed into its gradient memory, averaged over the
//                 ranks through the hook, unpacked back (local SGD)
//   outer step    every bucket's values minus the anchor into its gradient memory, averaged
//                 through the hook and negated: the averaged pseudo-gradient (anchor - local);
//                 the outer optimizer steps the anchor with it, and the values become the anchor
//
// The buckets' gradient memory is free between steps (the update zeroed it); it is zeroed again
// after a sync. A sync is collective, in bucket order on every rank, as a step's reduction.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"
#include "ddp/core/segment.hpp"
#include "ddp/optim/sgd.hpp"
#include "ddp/trainer/bucket.hpp"
#include "ddp/trainer/checkpoint_file.hpp"
#include "ddp/trainer/memory_held.hpp"
#include "ddp/trainer/parts.hpp"

namespace ddp::detail {

template <communicator Comm, device Device>
class sync_stage {
 public:
  using bucket_type = bucket<Comm, Device>;

  sync_stage(Device& dev, sync_schedule_part<Device>& schedule, std::span<bucket_type> buckets)
      : device_(dev), schedule_(schedule) {
    if (!keeps_anchor()) return;
    // At least one slot: the pseudo-gradient's arithmetic takes a state pointer it leaves alone.
    const auto slots = static_cast<std::size_t>(std::max(schedule.outer_state_slots(), 1));
    for (auto& bk : buckets) {
      anchor_.push_back(zeroed(bk.padded()));
      outer_state_.push_back(zeroed(slots * bk.padded()));
    }
  }
  sync_stage(const sync_stage&) = delete;
  sync_stage& operator=(const sync_stage&) = delete;

  bool keeps_anchor() const noexcept { return schedule_.outer_state_slots() >= 0; }
  // Step `step` (counting from 0) reduces no gradient: each rank updates with its own.
  bool local_step(std::uint64_t step) const { return !schedule_.every_step() && !schedule_.reduces_gradients(step); }
  std::uint64_t outer_steps() const noexcept { return outer_steps_; }

  // The parameters as they are now become the anchor (at construction, after a load that
  // brought no anchor).
  void capture_anchor(std::span<bucket_type> buckets) {
    for (std::size_t b = 0; b < anchor_.size(); ++b) buckets[b].pack_values(anchor_[b].data());
  }

  // After the update of step `step`: the schedule's sync, if it has one now. Returns whether the
  // parameters changed. Collective then.
  bool after_update(std::uint64_t step, std::span<bucket_type> buckets) {
    switch (schedule_.after_update(step)) {
      case sync_schedule::action::none:
        return false;
      case sync_schedule::action::average_parameters:
        average(buckets);
        return true;
      case sync_schedule::action::outer_step:
        outer_step(buckets);
        return true;
    }
    return false;
  }

  // The anchor and outer state: one copy of the parameters, and the outer optimizer's state.
  memory_held memory() const noexcept {
    memory_held m;
    for (const auto& a : anchor_) m.parameters += a.size() * sizeof(float);
    for (const auto& s : outer_state_) m.optimizer_state += s.size() * sizeof(float);
    return m;
  }

  // ---- checkpoint sections: equal on every rank (the anchor is the ranks' common point) ------

  void write_state(checkpoint_file& f, std::span<const bucket_type> buckets) const {
    if (!keeps_anchor()) return;
    f.set_text("sync/outer_steps", std::to_string(outer_steps_));
    for (std::size_t b = 0; b < anchor_.size(); ++b) {
      f.set_array("sync/anchor/" + std::to_string(b), std::span<const float>(host_copy(anchor_[b], buckets[b].numel(), 1)));
      f.set_array("sync/outer_state/" + std::to_string(b),
                  std::span<const float>(host_copy(outer_state_[b], buckets[b].numel(), slots())));
    }
  }
  std::optional<std::string> check_state(const checkpoint_file& f) const {
    if (keeps_anchor() && !f.has("meta/sync/outer_steps"))
      return "'" + f.path() + "' holds no anchor: it was saved under a sync schedule without outer steps, and '" +
             std::string(schedule_.name()) + "' needs one";
    return std::nullopt;
  }
  void read_state(const checkpoint_file& f, std::span<bucket_type> buckets) {
    if (!keeps_anchor()) return;
    outer_steps_ = f.number("sync/outer_steps");
    for (std::size_t b = 0; b < anchor_.size(); ++b) {
      const std::size_t n = buckets[b].numel(), padded = buckets[b].padded();
      device_.copy_from_host(anchor_[b].data(), f.array<float>("sync/anchor/" + std::to_string(b), n).data(),
                             n * sizeof(float));
      const auto state = f.array<float>("sync/outer_state/" + std::to_string(b), slots() * n);
      for (std::size_t k = 0; k < slots(); ++k)
        device_.copy_from_host(outer_state_[b].data() + k * padded, state.data() + k * n, n * sizeof(float));
    }
  }

 private:
  std::size_t slots() const noexcept { return static_cast<std::size_t>(std::max(schedule_.outer_state_slots(), 0)); }

  void average(std::span<bucket_type> buckets) {
    for (auto& bk : buckets) {
      bk.pack_values(bk.gradient_memory());
      bk.reduce_outside_step();
    }
    for (auto& bk : buckets) {
      bk.complete_reduction();
      bk.unpack_values(bk.gradient_memory());
      finish(bk);
    }
  }

  void outer_step(std::span<bucket_type> buckets) {
    // p -= 1 * g exactly: the local values minus the anchor (momentum 0 leaves the state alone).
    constexpr optim::sgd::rule difference{1.0f, 0.0f, 0.0f, false};
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      auto& bk = buckets[b];
      float* g = bk.gradient_memory();
      bk.pack_values(g);
      const segment whole{g, 0, bk.padded()};
      device_.template elementwise<1>(std::span<const segment>(&whole, 1), anchor_[b].data(), outer_state_[b].data(),
                                      bk.padded(), difference);
      bk.reduce_outside_step();
    }
    ++outer_steps_;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      auto& bk = buckets[b];
      bk.complete_reduction();
      float* g = bk.gradient_memory();
      device_.scale(g, bk.padded(), -1.0f);  // the averaged anchor - local
      const segment anchor{anchor_[b].data(), 0, bk.padded()};
      schedule_.outer_update(device_, std::span<const segment>(&anchor, 1), g, outer_state_[b].data(), bk.padded(),
                             static_cast<std::int64_t>(outer_steps_));
      bk.unpack_values(anchor_[b].data());
      finish(bk);
    }
  }

  void finish(bucket_type& bk) {
    bk.clear_works();
    device_.fill_zero(bk.gradient_memory(), bk.padded() * sizeof(float));
    bk.zero_gradients();
  }

  device_array<Device, float> zeroed(std::size_t n) {
    device_array<Device, float> a(device_, n);
    device_.fill_zero(a.data(), n * sizeof(float));
    return a;
  }
  // The first `n` floats of each of `slots` rows of `padded`-float stride.
  std::vector<float> host_copy(const device_array<Device, float>& a, std::size_t n, std::size_t rows) const {
    std::vector<float> out(n * rows);
    const std::size_t stride = rows ? a.size() / std::max<std::size_t>(rows, 1) : 0;
    for (std::size_t k = 0; k < rows && n; ++k) device_.copy_to_host(out.data() + k * n, a.data() + k * stride, n * sizeof(float));
    return out;
  }

  Device& device_;
  sync_schedule_part<Device>& schedule_;
  std::vector<device_array<Device, float>> anchor_;       // per bucket, padded floats
  std::vector<device_array<Device, float>> outer_state_;  // per bucket, max(slots, 1) rows of padded floats
  std::uint64_t outer_steps_ = 0;
};

}  // namespace ddp::detail
