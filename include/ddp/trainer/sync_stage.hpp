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
//   fragments     streaming DiLoCo: a fragment (the buckets b with b % F == f) starts its sync
//                 after its step: values minus anchor, reduced through the hook at once (Delay
//                 0), or into memory of its own by the communicator, in flight while the inner
//                 steps go on (Delay >= 1); Delay steps later the outer optimizer steps its
//                 anchor, and its values become mixing * local + (1 - mixing) * anchor
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

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"
#include "ddp/core/buffer.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/reduce_op.hpp"
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

  using work_type = typename bucket_type::work_type;

  sync_stage(Comm& comm, Device& dev, sync_schedule_part<Device>& schedule, std::span<bucket_type> buckets)
      : comm_(comm), device_(dev), schedule_(schedule) {
    check_fragments(buckets.size(), "construct");
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
  ~sync_stage() { drain(); }

  // Waits for the fragments in flight; one whose reduction failed (a peer was lost) is dropped:
  // its sync is skipped, on every rank that remains alike, and it syncs again at its next turn.
  void drain() noexcept {
    std::erase_if(pending_, [&](pending_fragment& p) {
      try {
        wait(p);
        return false;
      } catch (...) {
        return true;
      }
    });
  }

  bool keeps_anchor() const noexcept { return schedule_.outer_state_slots() >= 0; }
  // Step `step` (counting from 0) reduces no gradient: each rank updates with its own.
  bool local_step(std::uint64_t step) const { return !schedule_.every_step() && !schedule_.reduces_gradients(step); }

  // The parameters as they are now become the anchor (at construction, after a load that
  // brought no anchor).
  void capture_anchor(std::span<bucket_type> buckets) {
    for (std::size_t b = 0; b < anchor_.size(); ++b) buckets[b].pack_values(anchor_[b].data());
  }

  // After the update of step `step`: the schedule's sync, if it has one now. Returns whether the
  // parameters changed. Collective then.
  bool after_update(std::uint64_t step, std::span<bucket_type> buckets) {
    if (schedule_.fragments()) return stream(step, buckets);
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
    for (const auto& s : in_flight_) m.gradients += s.size() * sizeof(float);
    return m;
  }

  // ---- checkpoint sections: equal on every rank (the anchor is the ranks' common point) ------

  // A fragment still in flight is waited for (every rank saves at the same step) and its averaged
  // pseudo-gradient saved, to be applied at its step after a load.
  void write_state(checkpoint_file& f, std::span<const bucket_type> buckets) {
    if (!keeps_anchor()) return;
    f.set_text("sync/outer_steps", std::to_string(outer_steps_[0]));
    f.set_array("sync/fragment_outer_steps", std::span<const std::uint64_t>(outer_steps_));
    std::vector<std::uint64_t> pending;
    for (auto& p : pending_) {
      wait(p);
      pending.insert(pending.end(), {p.fragment, p.apply_at});
      for (std::size_t b = p.fragment; b < buckets.size(); b += fragments())
        f.set_array("sync/in_flight/" + std::to_string(b), std::span<const float>(host_copy(in_flight_[b], buckets[b].numel(), 1)));
    }
    f.set_array("sync/pending", std::span<const std::uint64_t>(pending));
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
    make_stream_memory(buckets);
    const auto& counts = f.section("sync/fragment_outer_steps");
    outer_steps_ = f.array<std::uint64_t>("sync/fragment_outer_steps", counts.size() / sizeof(std::uint64_t));
    make_stream_memory(buckets);
    pending_.clear();
    const auto& pending = f.section("sync/pending");
    const auto entries = f.array<std::uint64_t>("sync/pending", pending.size() / sizeof(std::uint64_t));
    for (std::size_t k = 0; k + 1 < entries.size(); k += 2) {
      pending_.push_back({static_cast<std::size_t>(entries[k]), entries[k + 1], {}});
      for (std::size_t b = entries[k]; b < buckets.size(); b += fragments()) {
        const std::size_t n = buckets[b].numel();
        device_.fill_zero(in_flight_[b].data(), in_flight_[b].size() * sizeof(float));
        device_.copy_from_host(in_flight_[b].data(), f.array<float>("sync/in_flight/" + std::to_string(b), n).data(),
                               n * sizeof(float));
      }
    }
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
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      values_minus_anchor(buckets[b], b, buckets[b].gradient_memory());
      buckets[b].reduce_outside_step();
    }
    ++outer_steps_[0];
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      auto& bk = buckets[b];
      bk.complete_reduction();
      step_anchor(b, bk.gradient_memory(), bk.padded(), outer_steps_[0]);
      bk.unpack_values(anchor_[b].data());
      finish(bk);
    }
  }

  // `averaged`: the ranks' mean of local - anchor; negated in place, it steps the anchor.
  void step_anchor(std::size_t b, float* averaged, std::size_t padded, std::uint64_t outer_step) {
    device_.scale(averaged, padded, -1.0f);
    const segment anchor{anchor_[b].data(), 0, padded};
    schedule_.outer_update(device_, std::span<const segment>(&anchor, 1), averaged, outer_state_[b].data(), padded,
                           static_cast<std::int64_t>(outer_step));
  }
  // into = values - anchor (p -= 1 * g exactly; momentum 0 leaves the state alone).
  void values_minus_anchor(bucket_type& bk, std::size_t b, float* into) {
    constexpr optim::sgd::rule difference{1.0f, 0.0f, 0.0f, false};
    bk.pack_values(into);
    const segment whole{into, 0, bk.padded()};
    device_.template elementwise<1>(std::span<const segment>(&whole, 1), anchor_[b].data(), outer_state_[b].data(),
                                    bk.padded(), difference);
  }

  // ---- streaming: fragments synced in turn, reductions in flight across inner steps ----------

  struct pending_fragment {
    std::size_t fragment = 0;
    std::uint64_t apply_at = 0;     // the step after whose update it is applied
    std::vector<work_type> works;  // Delay >= 1: the reductions in flight (none after a load)
  };
  std::size_t fragments() const noexcept { return schedule_.fragments(); }
  // A schedule chosen at run time (a one_of, a flag) may start streaming after construction: its
  // memory and counts are made on first use.
  void check_fragments(std::size_t buckets, const char* operation) const {
    if (fragments() > buckets)
      throw error("trainer", operation, comm_.rank(),
                  "sync schedule '" + std::string(schedule_.name()) + "' syncs " + std::to_string(fragments()) +
                      " fragments of the model, one bucket or more each, but the model fills " +
                      std::to_string(buckets) + " bucket(s): choose a smaller bucket_cap, or fewer fragments");
  }
  void make_stream_memory(std::span<bucket_type> buckets) {
    if (outer_steps_.size() < std::max<std::size_t>(fragments(), 1)) outer_steps_.resize(std::max<std::size_t>(fragments(), 1), 0);
    if (!fragments() || !in_flight_.empty()) return;
    check_fragments(buckets.size(), "step");
    for (auto& bk : buckets) in_flight_.push_back(zeroed(bk.padded()));
  }

  bool stream(std::uint64_t step, std::span<bucket_type> buckets) {
    make_stream_memory(buckets);
    if (const auto f = schedule_.fragment_due(step)) launch(*f, step, buckets);
    bool changed = false;
    while (!pending_.empty() && pending_.front().apply_at == step) {
      apply(pending_.front(), buckets);
      pending_.erase(pending_.begin());
      changed = true;
    }
    return changed;
  }
  void launch(std::size_t f, std::uint64_t step, std::span<bucket_type> buckets) {
    pending_fragment p{f, step + schedule_.delay(), {}};
    for (std::size_t b = f; b < buckets.size(); b += fragments()) {
      auto& bk = buckets[b];
      if (schedule_.delay() == 0) {  // through the hook, in the bucket's gradient memory
        values_minus_anchor(bk, b, bk.gradient_memory());
        bk.reduce_outside_step();
      } else {
        float* d = in_flight_[b].data();
        values_minus_anchor(bk, b, d);
        const comm::tag_scope tag(comm::purpose::sync, static_cast<std::int32_t>(b));
        p.works.push_back(comm_.all_reduce(const_buffer{d, bk.padded(), dtype::f32},
                                           mutable_buffer{d, bk.padded(), dtype::f32}, reduce_op::avg));
      }
    }
    pending_.push_back(std::move(p));
  }
  void wait(pending_fragment& p) {
    for (auto& w : p.works) w.wait();
    p.works.clear();
  }
  void apply(pending_fragment& p, std::span<bucket_type> buckets) {
    wait(p);
    const std::uint64_t outer_step = ++outer_steps_[p.fragment];
    const float keep = schedule_.mixing();
    for (std::size_t b = p.fragment; b < buckets.size(); b += fragments()) {
      auto& bk = buckets[b];
      float* g = bk.gradient_memory();
      if (schedule_.delay() == 0) {
        bk.complete_reduction();
        bk.clear_works();
        step_anchor(b, g, bk.padded(), outer_step);
      } else {
        step_anchor(b, in_flight_[b].data(), bk.padded(), outer_step);
      }
      if (keep == 0.0f) {
        bk.unpack_values(anchor_[b].data());
      } else {  // values -= (1 - mixing) (values - anchor)
        values_minus_anchor(bk, b, g);
        float* mixed = in_flight_[b].data();
        bk.pack_values(mixed);
        const segment whole{mixed, 0, bk.padded()};
        device_.template elementwise<1>(std::span<const segment>(&whole, 1), g, outer_state_[b].data(), bk.padded(),
                                        optim::sgd::rule{1.0f - keep, 0.0f, 0.0f, false});
        bk.unpack_values(mixed);
      }
      device_.fill_zero(g, bk.padded() * sizeof(float));
      bk.zero_gradients();
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

  Comm& comm_;
  Device& device_;
  sync_schedule_part<Device>& schedule_;
  std::vector<device_array<Device, float>> anchor_;       // per bucket, padded floats
  std::vector<device_array<Device, float>> outer_state_;  // per bucket, max(slots, 1) rows of padded floats
  std::vector<device_array<Device, float>> in_flight_;    // streaming, per bucket: a fragment's reduction
  std::vector<std::uint64_t> outer_steps_ = {0};          // outer steps taken, per fragment
  std::vector<pending_fragment> pending_;                 // fragments reducing, in launch order
};

}  // namespace ddp::detail
