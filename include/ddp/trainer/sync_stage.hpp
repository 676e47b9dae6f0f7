#pragma once
// The sync schedule's part of a step (ddp/policy/sync_schedule.hpp): which steps reduce their
// gradients, and the sync after an update. Owns what a schedule keeps between syncs: the anchor
// (the parameters after the last outer step, in bucket layout) and the outer optimizer's state,
// and the count of outer steps taken.
//
//   local step    the reducer launches no collective (gradient_reducer::set_local): each rank
//                 updates with its own gradients
//   average       every bucket's f32 values packed into its gradient memory, averaged over the
//                 ranks in f32 (a lossy hook would move the parameters themselves), unpacked back
//                 (local SGD)
//   outer step    every bucket's values minus the anchor into its gradient memory, averaged
//                 through the hook and negated: the averaged pseudo-gradient (anchor - local);
//                 the outer optimizer steps the anchor with it, and the values become the anchor
//
//   sync now      the period's sync at once, whole: local SGD's average, or every fragment's
//                 outer step without mixing (one in flight applied first, ahead of its step);
//                 nothing when the ranks hold the same parameters already
//   joining       a rank that joins takes a peer's state, then starts from the anchor
//
//   fragments     streaming DiLoCo: a fragment (the buckets b with b % F == f) starts its sync
//                 after its step: values minus anchor, reduced through the hook at once (Delay
//                 0), or in memory of its own, the hook's collectives held while the inner
//                 steps go on (Delay >= 1; sync_fragments.hpp holds them); Delay steps later the outer optimizer steps its
//                 anchor, and its values become mixing * local + (1 - mixing) * anchor
//
// The buckets' gradient memory is free between steps (the update zeroed it); it is zeroed again
// after a sync. A sync is collective, in bucket order on every rank, as a step's reduction, and
// goes in two phases: every reduction completes (a stream backend's failures read back) before
// any parameter, anchor or count changes, so a sync that fails leaves the state of the step's
// update, which the step counts (trainer_core::finish_update).
#include <algorithm>
#include <exception>
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
#include "ddp/concepts/work.hpp"
#include "ddp/core/buffer.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/reduce_op.hpp"
#include "ddp/core/segment.hpp"
#include "ddp/optim/sgd.hpp"
#include "ddp/trainer/bucket.hpp"
#include "ddp/trainer/checkpoint_file.hpp"
#include "ddp/trainer/memory_held.hpp"
#include "ddp/trainer/parts.hpp"
#include "ddp/trainer/sync_fragments.hpp"

namespace ddp::detail {

template <communicator Comm, device Device>
class sync_stage {
 public:
  using bucket_type = bucket<Comm, Device>;
  using work_type = typename bucket_type::work_type;
  using fragment = typename sync_fragments<Comm, Device>::pending;

  sync_stage(Comm& comm, Device& dev, sync_schedule_part<Device>& schedule, std::span<bucket_type> buckets)
      : comm_(comm), device_(dev), schedule_(schedule), buckets_(buckets.size()) {
    if (const auto why = fragments_refusal()) throw error("trainer", "construct", comm.rank(), *why);
    if (!keeps_anchor()) return;
    // At least one slot: the pseudo-gradient's arithmetic takes a state pointer it leaves alone.
    const auto slots = static_cast<std::size_t>(std::max(schedule.outer_state_slots(), 1));
    for (auto& bk : buckets) {
      anchor_.push_back(zeroed_array<float>(device_, bk.padded()));
      outer_state_.push_back(zeroed_array<float>(device_, slots * bk.padded()));
    }
  }
  sync_stage(const sync_stage&) = delete;
  sync_stage& operator=(const sync_stage&) = delete;

  bool keeps_anchor() const noexcept { return schedule_.outer_state_slots() >= 0; }
  // Step `step` (counting from 0) reduces no gradient: each rank updates with its own.
  bool local_step(std::uint64_t step) const { return !schedule_.every_step() && !schedule_.reduces_gradients(step); }

  // Before a step: the parameters as they are become the anchor, the first time (after the
  // module's values were set: at construction, by the program, or by a load that brought none).
  void before_step(std::span<bucket_type> buckets) {
    if (anchored_ || !keeps_anchor()) return;
    for (std::size_t b = 0; b < anchor_.size(); ++b) buckets[b].pack_values(anchor_[b].data());
    anchored_ = true;
  }

  // After the update of step `step`: the schedule's sync, if it has one now. Collective then.
  void after_update(std::uint64_t step, std::span<bucket_type> buckets) {
    before_step(buckets);  // a step captured, or replayed, without its begin
    if (local_step(step)) synced_ = false;
    if (schedule_.fragments()) return stream(step, buckets);
    const auto action = schedule_.after_update(step);
    if (action == sync_schedule::action::average_parameters) average(step, buckets);
    else if (action == sync_schedule::action::outer_step) outer_step(step, buckets);
  }

  // The period's sync now, whole (local SGD's average, or every fragment's outer step without
  // mixing), unless the ranks hold the same parameters already. Collective then, between steps.
  void sync_now(std::uint64_t step, std::span<bucket_type> buckets) {
    if (synced_ || schedule_.every_step()) return;
    if (!keeps_anchor()) return average(step, buckets);
    make_stream_memory(buckets);
    for (auto& in_flight = fragments_.in_flight(); !in_flight.empty(); fragments_.pop_front()) {
      finish_fragment(in_flight.front(), buckets);  // the hook's finish runs (its state)
      apply(in_flight.front(), buckets);
    }
    outer_step(step, buckets);
  }

  // A rank that joins a run, after it took a peer's state: its parameters become the anchor, so
  // that the next sync averages each survivor's inner progress once (not the peer's twice).
  // Without an anchor (local SGD, or no step yet) the peer's stay. Whether they changed.
  bool start_from_anchor(std::span<bucket_type> buckets) {
    if (!keeps_anchor() || !anchored_) return false;
    for (std::size_t b = 0; b < anchor_.size(); ++b) buckets[b].unpack_values(anchor_[b].data());
    return true;
  }

  // Waits for the fragments in flight; one whose reduction failed (a peer was lost) is dropped:
  // its sync is skipped, and it syncs again at its next turn.
  void drain() noexcept { fragments_.drain(); }
  // For the ranks that go on after a failure: every fragment in flight is dropped, on every rank
  // alike, whether or not its reduction completed here.
  void drop_in_flight() noexcept { fragments_.drop(); }

  // The anchor and outer state: one copy of the parameters, and the outer optimizer's state.
  memory_held memory() const noexcept {
    memory_held m;
    for (const auto& a : anchor_) m.parameters += a.size() * sizeof(float);
    for (const auto& s : outer_state_) m.optimizer_state += s.size() * sizeof(float);
    m.gradients += fragments_.bytes();
    return m;
  }

  // ---- checkpoint sections: equal on every rank (the anchor is the ranks' common point) ------

  // A fragment still in flight is completed (every rank saves at the same step; before the hook's
  // state is saved, which its finish may change) and its averaged pseudo-gradient saved, to be
  // applied at its step after a load.
  void complete_in_flight(std::span<bucket_type> buckets) {
    for (auto& p : fragments_.in_flight()) finish_fragment(p, buckets);
  }
  void write_state(checkpoint_file& f, std::span<bucket_type> buckets) {
    if (schedule_.every_step()) return;
    f.set_text("sync/synced", synced_ ? "1" : "0");
    if (!keeps_anchor()) return;
    f.set_array("sync/outer_steps", std::span<const std::uint64_t>(outer_steps_));
    fragments_.write_state(f, buckets, fragments(), schedule_.delay());
    if (!anchored_) return;  // no step yet: the anchor is taken at the first one, after the load
    for (std::size_t b = 0; b < anchor_.size(); ++b) {
      f.set_array("sync/anchor/" + std::to_string(b), std::span<const float>(host_copy(anchor_[b], buckets[b].numel(), 1)));
      f.set_array("sync/outer_state/" + std::to_string(b),
                  std::span<const float>(host_copy(outer_state_[b], buckets[b].numel(), slots())));
    }
  }
  std::optional<std::string> check_state(const checkpoint_file& f) const {
    if (const auto why = fragments_refusal()) return why;
    if (keeps_anchor() && !f.has("sync/outer_steps"))
      return "'" + f.path() + "' holds no anchor: it was saved under a sync schedule without outer steps, and '" +
             std::string(schedule_.name()) + "' needs one";
    return std::nullopt;
  }
  void read_state(const checkpoint_file& f, std::span<bucket_type> buckets) {
    if (schedule_.every_step()) return;
    synced_ = f.has("sync/synced") && f.text("sync/synced") == "1";
    if (!keeps_anchor()) return;
    outer_steps_ = f.array<std::uint64_t>("sync/outer_steps", f.section("sync/outer_steps").size() / sizeof(std::uint64_t));
    make_stream_memory(buckets);
    fragments_.read_state(f, buckets, fragments());
    anchored_ = f.has("sync/anchor/0");
    if (!anchored_) return;
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
  std::size_t fragments() const noexcept { return schedule_.fragments(); }
  // A schedule chosen at run time (a one_of, a flag) may start streaming after construction: its
  // memory and counts are made on first use.
  std::optional<std::string> fragments_refusal() const {
    if (fragments() <= buckets_) return std::nullopt;
    return "sync schedule '" + std::string(schedule_.name()) + "' syncs " + std::to_string(fragments()) +
           " fragments of the model, one bucket or more each, but the model fills " + std::to_string(buckets_) +
           " bucket(s): choose a smaller bucket_cap, or fewer fragments";
  }
  void make_stream_memory(std::span<bucket_type> buckets) {
    const std::size_t counts = std::max<std::size_t>(fragments(), 1);
    if (outer_steps_.size() < counts) outer_steps_.resize(counts, 0);
    if (!fragments() || fragments_.has_memory()) return;
    if (const auto why = fragments_refusal()) throw error("trainer", "step", comm_.rank(), *why);
    fragments_.make_memory(buckets);
  }

  // Phase one: the reductions started on buckets first, first + stride, ... complete, and on a
  // stream backend the host learns whether they failed.
  void complete(std::uint64_t step, std::span<bucket_type> buckets, std::size_t first, std::size_t stride) {
    for (std::size_t b = first; b < buckets.size(); b += stride) buckets[b].complete_reduction(step);
    if constexpr (stream_ordered_work<work_type>) {
      device_.synchronize();
      for (std::size_t b = first; b < buckets.size(); b += stride) buckets[b].rethrow_failures();
    }
  }
  void finish(bucket_type& bk) {
    bk.clear_works();
    device_.fill_zero(bk.gradient_memory(), bk.padded() * sizeof(float));
    bk.zero_gradients();
  }

  void average(std::uint64_t step, std::span<bucket_type> buckets) {
    for (auto& bk : buckets) {
      bk.pack_values(bk.gradient_memory());
      bk.reduce_outside_step(/*through_hook=*/false, step);
    }
    complete(step, buckets, 0, 1);
    for (auto& bk : buckets) {
      bk.unpack_values(bk.gradient_memory());
      finish(bk);
    }
    synced_ = true;
  }

  // Every bucket's outer step; under streaming each fragment counts its own (bucket b: b % F).
  void outer_step(std::uint64_t step, std::span<bucket_type> buckets) {
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      values_minus_anchor(buckets[b], b, buckets[b].gradient_memory());
      buckets[b].reduce_outside_step(/*through_hook=*/true, step);
    }
    complete(step, buckets, 0, 1);
    const std::size_t counts = outer_steps_.size();
    for (auto& count : outer_steps_) ++count;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      auto& bk = buckets[b];
      step_anchor(b, bk.gradient_memory(), bk.padded(), outer_steps_[b % counts]);
      bk.unpack_values(anchor_[b].data());
      finish(bk);
    }
    synced_ = true;
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

  void stream(std::uint64_t step, std::span<bucket_type> buckets) {
    make_stream_memory(buckets);
    if (const auto f = schedule_.fragment_due(step)) launch(*f, step, buckets);
    for (auto& in_flight = fragments_.in_flight(); !in_flight.empty() && in_flight.front().apply_at == step;) {
      try {
        if (schedule_.delay() == 0) complete(step, buckets, in_flight.front().fragment, fragments());
        else finish_fragment(in_flight.front(), buckets);
      } catch (...) {  // the fragment's sync is skipped; the step's update stands
        fragments_.pop_front();
        throw;
      }
      apply(in_flight.front(), buckets);
      fragments_.pop_front();
    }
  }
  void launch(std::size_t f, std::uint64_t step, std::span<bucket_type> buckets) {
    fragment p{f, step + schedule_.delay(), {}, false};
    for (std::size_t b = f; b < buckets.size(); b += fragments()) {
      auto& bk = buckets[b];
      if (schedule_.delay() == 0) {  // through the hook, in the bucket's gradient memory
        values_minus_anchor(bk, b, bk.gradient_memory());
        bk.reduce_outside_step(/*through_hook=*/true, step);
      } else {  // in flight across inner steps, which use the bucket's memory: in memory of its own
        float* d = fragments_.memory(b);
        values_minus_anchor(bk, b, d);
        for (auto& w : bk.reduce_held(d, step)) p.works.push_back(std::move(w));
      }
    }
    fragments_.add(std::move(p));
  }
  // Phase one of a fragment's sync (Delay >= 1), as of the step it began in (sync_fragments.hpp).
  void finish_fragment(fragment& p, std::span<bucket_type> buckets) {
    fragments_.finish(p, buckets, fragments(), p.apply_at - schedule_.delay());
  }
  // Phase two of a fragment's sync: its reductions completed.
  void apply(fragment& p, std::span<bucket_type> buckets) {
    const std::uint64_t outer_step = ++outer_steps_[p.fragment];
    const float keep = schedule_.mixing();
    for (std::size_t b = p.fragment; b < buckets.size(); b += fragments()) {
      auto& bk = buckets[b];
      float* g = bk.gradient_memory();
      step_anchor(b, schedule_.delay() == 0 ? g : fragments_.memory(b), bk.padded(), outer_step);
      if (keep == 0.0f) {
        bk.unpack_values(anchor_[b].data());
      } else {  // values -= (1 - mixing) (values - anchor)
        values_minus_anchor(bk, b, g);
        float* mixed = fragments_.memory(b);
        bk.pack_values(mixed);
        const segment whole{mixed, 0, bk.padded()};
        device_.template elementwise<1>(std::span<const segment>(&whole, 1), g, outer_state_[b].data(), bk.padded(),
                                        optim::sgd::rule{1.0f - keep, 0.0f, 0.0f, false});
        bk.unpack_values(mixed);
      }
      finish(bk);
    }
  }

  // The first `n` floats of each of `rows` rows of the array (its size / rows floats apart).
  std::vector<float> host_copy(const device_array<Device, float>& a, std::size_t n, std::size_t rows) const {
    std::vector<float> out(n * rows);
    const std::size_t stride = rows ? a.size() / std::max<std::size_t>(rows, 1) : 0;
    for (std::size_t k = 0; k < rows && n; ++k) device_.copy_to_host(out.data() + k * n, a.data() + k * stride, n * sizeof(float));
    return out;
  }

  Comm& comm_;
  Device& device_;
  sync_schedule_part<Device>& schedule_;
  std::size_t buckets_ = 0;
  std::vector<device_array<Device, float>> anchor_;       // per bucket, padded floats
  std::vector<device_array<Device, float>> outer_state_;  // per bucket, max(slots, 1) rows of padded floats
  std::vector<std::uint64_t> outer_steps_ = {0};          // outer steps taken, per fragment
  sync_fragments<Comm, Device> fragments_{device_};       // streaming: fragments reducing, in launch order
  bool anchored_ = false;                                 // the anchor holds the parameters of a step
  bool synced_ = true;  // every rank holds the same parameters (every step since the last whole sync reduced)
};

}  // namespace ddp::detail
