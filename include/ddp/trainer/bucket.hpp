#pragma once
// One gradient bucket: its memory and its layout (which part this rank updates, from the update
// policy); the collectives in flight on it are a part of their own (bucket_collectives.hpp). The
// gradient reducer (gradient_reducer.hpp) builds and owns the buckets and launches them; the
// update policy's memory plan says which collective reduces the gradients (all_reduce, or
// reduce_scatter when a rank updates only its shard). Each other client sees one face of a bucket:
//
//   the communication hook comm_hook::bucket_io_on<Device> (bucket_hook_io.hpp, one per call)
//   the update stage       the averaged shard of the gradients, where parameters lie in it, and
//                          the all_gather of the updated shards
//
// Memory of grads (and of values, when the update policy gathers parameters): the parameters'
// slots in [0, numel), zero padding up to `padded`, then `control` floats (the reducer's control
// channel: last bucket only). This rank updates [shard_begin, shard_begin + shard).
// When the update policy keeps only its shard of the gradients (update::sharded_gradients), grads
// is held from a backward's first gradient to the completed reduction only (memory the reducer
// gives from its pool): then this rank's shard and the control floats are copied out and the
// memory goes back.
// When the update policy keeps only its shard of the parameters too (update::fully_sharded),
// values is held only while the bucket's layers run (memory the reducer gives from its pool,
// filled by an all_gather of every rank's kept shard); this rank's shard lives in a memory of
// its own, which the optimizer updates.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/segment.hpp"
#include "ddp/policy/comm_hook.hpp"
#include "ddp/policy/update.hpp"
#include "ddp/trainer/bucket_hook_io.hpp"
#include "ddp/trainer/bucket_collectives.hpp"
#include "ddp/trainer/bucket_layout.hpp"
#include "ddp/trainer/control_route.hpp"
#include "ddp/trainer/exact_sum.hpp"
#include "ddp/trainer/parts.hpp"

namespace ddp::detail {

template <communicator Comm, device Device>
class bucket final {
 public:
  using work_type = decltype(std::declval<Comm&>().all_reduce(const_buffer{}, mutable_buffer{}, reduce_op::avg));

  // `params`: the parameters in it, in the plan's order.
  bucket(Comm& comm, Device& dev, comm_hook_part<Device>& hook, const bucket_shape& shape, std::vector<std::size_t> params)
      : comm_(&comm), device_(&dev), hook_(&hook), shape_(shape), params_(std::move(params)),
        grads_(shape.memory.shards_gradients() ? device_array<Device, float>()
                                               : zeroed_array<float>(dev, shape.layout.padded + shape.control)),
        values_(shape.memory.gathers_parameters() ? zeroed_array<float>(dev, shape.layout.padded) : device_array<Device, float>()),
        kept_shard_(shape.memory.shards_gradients() ? zeroed_array<float>(dev, shape.layout.shard) : device_array<Device, float>()),
        kept_control_(shape.memory.shards_gradients() ? zeroed_array<float>(dev, shape.control) : device_array<Device, float>()),
        kept_values_(shape.memory.shards_parameters() ? zeroed_array<float>(dev, shape.layout.shard) : device_array<Device, float>()) {
    if (shape.virtual_shards) exact_.emplace(comm, dev, shape.layout.padded, shape.virtual_shards);
  }

  // ---- built by the reducer, parameter by parameter -------------------------------------

  // An f32 parameter's gradient; returns where it lives in the bucket (to bind the module's
  // gradient there when it binds gradient storage; nullptr while the bucket holds no gradients).
  float* add_gradient(float* module_grad, std::size_t offset, std::size_t count) {
    float* in_bucket = held() ? grads_.data() + offset : nullptr;
    segments_.push_back({shape_.gradients_in_bucket() ? in_bucket : module_grad, offset, count});
    return in_bucket;
  }
  // A 16-bit parameter's gradient, widened into the bucket when it launches.
  void add_half_gradient(void* module_grad, dtype type, std::size_t offset, std::size_t count) {
    half_grads_.push_back({module_grad, type, offset, count});
  }
  // The f32 value the optimizer updates; returns where it lives when the module binds its
  // parameters into the gathered copy, else `value` itself.
  float* add_value(float* value, std::size_t offset, std::size_t count, std::size_t rows) {
    float* v = shape_.bound.values ? values_.data() + offset : value;
    value_segments_.push_back({v, offset, count});
    tensors_.push_back({offset, rows, count / rows});
    return v;
  }

  // ---- the reducer's face -----------------------------------------------------------------

  std::size_t index() const noexcept { return shape_.index; }
  std::size_t numel() const noexcept { return shape_.numel; }
  std::size_t padded() const noexcept { return shape_.layout.padded; }
  std::size_t control_floats() const noexcept { return shape_.control; }
  std::span<const std::size_t> parameters() const noexcept { return params_; }

  // Readiness in the step's last backward: the parameters still to report.
  void expect(std::size_t parameters) noexcept { pending_ = parameters; }
  bool ready_one() noexcept { return --pending_ == 0; }
  bool ready() const noexcept { return pending_ == 0; }

  // ---- the full gradients, when the update policy keeps only its shard --------------------

  bool releases_gradients() const noexcept { return shape_.memory.shards_gradients(); }
  bool held() const noexcept { return !shape_.memory.shards_gradients() || held_; }
  std::size_t held_floats() const noexcept { return padded() + shape_.control; }
  // Holds the full gradients in `memory` (at least held_floats(), zeroed here); the module's
  // gradients of this bucket are then to be placed at gradient_memory() + offset.
  void hold_gradients(device_array<Device, float> memory) {
    device_->fill_zero(memory.data(), held_floats() * sizeof(float));
    grads_ = std::move(memory);
    held_ = true;
    for (auto& s : segments_) s.tensor = grads_.data() + s.offset;
  }
  float* gradient_memory() noexcept { return grads_.data(); }
  // Bytes held now: gradients (with the control floats and a releasing bucket's kept shard) and
  // the gathered parameters.
  std::size_t gradient_bytes() const noexcept {
    return (grads_.size() + kept_shard_.size() + kept_control_.size()) * sizeof(float);
  }
  std::size_t parameter_bytes() const noexcept { return (values_.size() + kept_values_.size()) * sizeof(float); }
  // After complete_reduction: this rank's shard and the control floats stay, the memory goes
  // back to the caller (who placed the module's gradients nowhere first).
  device_array<Device, float> release_gradients() {
    device_->copy(kept_shard_.data(), grads_.data() + shard_begin(), shard() * sizeof(float));
    device_->copy(kept_control_.data(), grads_.data() + padded(), shape_.control * sizeof(float));
    held_ = false;
    for (auto& s : segments_) s.tensor = nullptr;
    return std::move(grads_);
  }
  // ---- the gathered parameters, when the update policy keeps only its shard of them ----------

  bool shards_parameters() const noexcept { return shape_.memory.shards_parameters(); }
  // The gathered parameters have memory (their all_gather may still be in flight).
  bool values_held() const noexcept { return values_.size() != 0; }
  float* value_memory() noexcept { return values_.data(); }
  // Holds `memory` (at least padded() floats) for the parameters and starts the all_gather of
  // every rank's kept shard into it; `gather`: false when the contents are about to be written
  // over (a checkpoint's values), so no collective goes.
  void hold_values(device_array<Device, float> memory, bool gather) {
    values_ = std::move(memory);
    const comm::tag_scope tag(comm::purpose::gather, static_cast<std::int32_t>(index()));
    if (gather)
      works_.start_layer_gather(comm_->all_gather(const_buffer{kept_values_.data(), shard(), dtype::f32},
                                                  mutable_buffer{values_.data(), padded(), dtype::f32}));
  }
  // Waits for the parameters' all_gather, if one is in flight.
  void wait_values() { works_.wait_layer_gather(); }
  // The gathered values into this rank's kept shard (after the module's values were written there).
  void keep_value_shard() {
    device_->copy(kept_values_.data(), values_.data() + shard_begin(), shard() * sizeof(float));
  }
  // The gathered memory back to the caller, after its all_gather (the caller placed the module's
  // values nowhere first).
  device_array<Device, float> release_values() {
    wait_values();
    return std::move(values_);
  }

  // The step's reduction of this bucket completed (until clear_works).
  bool completed() const noexcept { return completed_; }

  // Gradients into bucket memory, the control floats after them, then their reduction in step
  // `step` as the memory plan says; the control floats (the last bucket's) go as `route` says,
  // decided by the reducer's control channel before the hook runs. `plain_hook`: the hook
  // declares plain, so it must take control floats routed with the gradients.
  void launch(std::span<const float> control, control_route route, bool plain_hook, std::uint64_t step) {
    control_route_ = route;
    plain_hook_ = plain_hook;
    gather_gradients(grads_.data());
    if (!control.empty())
      device_->copy_from_host(grads_.data() + padded(), control.data(), control.size_bytes());
    start_reduction(shape_.memory.scatters_gradients(), step);
  }
  // A sync schedule's local step: gradients and control floats into bucket memory, no collective.
  void launch_local(std::span<const float> control) {
    local_ = true;
    gather_gradients(grads_.data());
    if (!control.empty())
      device_->copy_from_host(grads_.data() + padded(), control.data(), control.size_bytes());
  }
  // A sync schedule's sync after step `step`: the padded() floats the caller wrote into
  // gradient_memory() averaged over the ranks (complete_reduction waits), through the hook or
  // in f32 by the communicator itself.
  void reduce_outside_step(bool through_hook, std::uint64_t step) {
    local_ = false;
    control_route_ = control_route::none;
    plain_sync_ = !through_hook;
    if (through_hook) return start_reduction(false, step, comm::purpose::sync);
    const comm::tag_scope tag(comm::purpose::sync, static_cast<std::int32_t>(index()));
    float* g = grads_.data();
    track(comm_->all_reduce(const_buffer{g, padded(), dtype::f32}, mutable_buffer{g, padded(), dtype::f32},
                            reduce_op::avg));
  }
  // A sync held across steps (a streaming fragment in flight): the hook over the caller's `data`
  // as of step `step`; the caller waits for the collectives handed out, then calls finish_held.
  std::vector<work_type> reduce_held(float* data, std::uint64_t step) {
    const comm::tag_scope tag(comm::purpose::sync, static_cast<std::int32_t>(index()));
    scatters_ = false;
    control_route_ = control_route::none;
    hook_view io(*this, step, data);
    hook_->reduce(io);
    return works_.take_reduction();
  }
  void finish_held(float* data, std::uint64_t step) {
    const comm::tag_scope tag(comm::purpose::sync, static_cast<std::int32_t>(index()));
    hook_view io(*this, step, data);
    hook_->finish(io);
    io.wait();
    works_.take_reduction();
  }
  // The f32 values the optimizer updates, to or from bucket layout (`bucket`: padded() floats).
  void pack_values(float* bucket) { device_->pack(value_segments_, bucket); }
  void unpack_values(const float* bucket) { device_->unpack(value_segments_, bucket); }

  // Waits for the reduction and lets the hook complete it (in step `step`, the step it went out
  // in): the averaged gradients are in place.
  void complete_reduction(std::uint64_t step) {
    completed_ = true;
    if (local_) return;
    hook_view io(*this, step);
    io.wait();
    works_.wait_control();
    if (plain_sync_) return;
    hook_->finish(io);
    if (exact_) exact_->finish(grads_.data(), io.shard_begin(), io.shard());
  }
  // Under an exact sum (reduction::invariant): a micro-batch before the step's last ends; its
  // gradients are set aside in bucket layout (the caller zeroes the module's).
  void set_aside_micro_batch() {
    gather_gradients(exact_->set_aside_next(index()));
    exact_->set_aside_done();
  }
  // The averaged control floats (after complete_reduction).
  void read_control(std::span<float> out) const {
    const float* control = held() ? grads_.data() + padded() : kept_control_.data();
    device_->copy_to_host(out.data(), control, out.size_bytes());
    rethrow_failures();
  }
  // The gradients' reduction (the hook's first collective), when one went out.
  const std::optional<work_type>& reduction() const noexcept { return works_.reduction(); }
  // A stream backend's failure that aborted this bucket's collectives (ddp::rethrow_failure):
  // after the host has synchronised with the device.
  void rethrow_failures() const { works_.rethrow_failures(); }

  void zero_gradients() {
    if (shape_.memory.shards_gradients()) device_->fill_zero(kept_shard_.data(), shard() * sizeof(float));
    if (held() && shape_.gradients_in_bucket())
      device_->fill_zero(grads_.data(), numel() * sizeof(float));
    else if (held())
      for (const auto& s : segments_) device_->fill_zero(s.tensor, s.count * sizeof(float));
    for (const auto& h : half_grads_) device_->fill_zero(h.tensor, h.count * size_of(h.type));
  }

  // Waits for every collective in flight, ignoring failures (a step that failed half-way).
  void drain() noexcept { works_.drain(); }
  void clear_works() {
    works_.clear();
    completed_ = false;
    local_ = false;
    plain_sync_ = false;
  }

  // The hook's state (PowerSGD's error feedback), for checkpoints.
  std::vector<device_array<Device, float>>& hook_state() noexcept { return hook_state_; }
  const std::vector<device_array<Device, float>>& hook_state() const noexcept { return hook_state_; }

  // Module values -> the gathered copy (parameters the module keeps itself).
  void stage_values() { device_->pack(value_segments_, values_.data()); }

  // ---- the update stage's face --------------------------------------------------------------

  std::size_t shard() const noexcept { return shape_.layout.shard; }
  std::size_t shard_begin() const noexcept { return shape_.layout.begin; }
  bool sharded() const noexcept { return shard() < padded(); }
  // This rank's shard of the averaged gradients.
  float* gradient_shard() noexcept {
    return shape_.memory.shards_gradients() && !held_ ? kept_shard_.data() : grads_.data() + shard_begin();
  }
  // The averaged gradients back into the module's own gradient tensors (optim::external).
  void unpack_gradients() {
    if (!shape_.gradients_in_bucket()) device_->unpack(segments_, grads_.data());
  }
  // The part of a parameter's value (offset in the bucket) inside this rank's shard: where its
  // values start, its offset from the shard's start, its count (0 when none of it is there).
  // When the parameters are sharded, the values are in the kept shard, whatever s.tensor says.
  segment shard_part(const segment& s) {
    const std::size_t begin = std::max(s.offset, shard_begin());
    const std::size_t end = std::min(s.offset + s.count, shard_begin() + shard());
    if (end <= begin) return {s.tensor, 0, 0};
    if (shape_.memory.shards_parameters()) return {kept_values_.data() + (begin - shard_begin()), begin - shard_begin(), end - begin};
    return {s.tensor + (begin - s.offset), begin - shard_begin(), end - begin};
  }

  // After this rank updated its shard, when the plan keeps a gathered copy: every rank's updated
  // shard of the parameters to every rank.
  void all_gather_parameters() {
    const comm::tag_scope tag(comm::purpose::gather, static_cast<std::int32_t>(index()));
    float* v = values_.data();
    if (!shape_.bound.values) {  // this rank's shard of the module's parameters, copied in first
      std::vector<segment> mine;
      for (const auto& s : value_segments_)
        if (const segment part = shard_part(s); part.count) mine.push_back(part);
      device_->pack(mine, v + shard_begin());
    }
    works_.start_update_gather(comm_->all_gather(const_buffer{v + shard_begin(), shard(), dtype::f32},
                                                 mutable_buffer{v, padded(), dtype::f32}));
  }
  // Waits for all_gather_parameters and leaves the parameters where the module reads them.
  void finish_parameters() {
    if (!works_.wait_update_gather()) return;
    if (!shape_.bound.values) device_->unpack(value_segments_, values_.data());
  }

 private:
  // The module's gradients in bucket layout at `into` (f32 ones copied unless they live there,
  // 16-bit ones widened).
  void gather_gradients(float* into) {
    if (!shape_.gradients_in_bucket() || into != grads_.data()) device_->pack(segments_, into);
    for (const auto& h : half_grads_)
      device_->cast(const_buffer{h.tensor, h.count, h.type}, mutable_buffer{into + h.offset, h.count, dtype::f32});
  }

  // The gradients' reduction: all of them (all_reduce) or this rank's shard (reduce_scatter),
  // through the hook; then the control floats in f32 when they go after the gradients, or when
  // they were offered to the gradients' all_reduce and the hook reduced the gradients otherwise
  // (every rank runs the same hook: it decides alike). A plain hook must take them.
  void start_reduction(bool scatter, std::uint64_t step, comm::purpose what = comm::purpose::gradients) {
    const comm::tag_scope tag(what, static_cast<std::int32_t>(index()));
    scatters_ = scatter;
    hook_view io(*this, step);
    hook_->reduce(io);
    if (!shape_.control) return;
    const bool carried = control_route_ == control_route::with_gradients && io.carried_control;
    if (control_route_ == control_route::with_gradients && !carried && plain_hook_)
      throw collective_error("comm_hook", "reduce", comm_->rank(),  // on every rank alike
                  "comm hook '" + std::string(hook_->name()) + "' declares `plain` (it leaves the gradients to "
                  "the plain all_reduce), but did not call bucket_io::reduce_gradients() for bucket " +
                      std::to_string(index()) + ": call it, or drop `plain` from the hook");
    if (control_route_ == control_route::after_gradients || (control_route_ == control_route::with_gradients && !carried)) {
      float* c = grads_.data() + padded();
      works_.start_control(comm_->all_reduce(const_buffer{c, shape_.control, dtype::f32},
                                             mutable_buffer{c, shape_.control, dtype::f32}, reduce_op::avg));
    }
  }

  void track(work_type w) { works_.add_reduction(std::move(w)); }

  friend class bucket_hook_io<Comm, Device>;
  using hook_view = bucket_hook_io<Comm, Device>;

  Comm* comm_;
  Device* device_;
  comm_hook_part<Device>* hook_;
  bucket_shape shape_;

  std::vector<std::size_t> params_;
  std::vector<segment> segments_;                 // module grad <-> bucket grads, f32 parameters
  std::vector<half_segment> half_grads_;          // 16-bit parameters' gradients, widened into the bucket
  std::vector<segment> value_segments_;           // the optimizer's values <-> values_
  std::vector<comm_hook::tensor_layout> tensors_;  // each parameter's place and matrix shape
  device_array<Device, float> grads_;
  device_array<Device, float> values_;            // gathered parameters, when the update policy gathers
  device_array<Device, float> kept_shard_;        // releasing: this rank's shard of the averaged gradients
  device_array<Device, float> kept_control_;      // releasing: the averaged control floats
  device_array<Device, float> kept_values_;       // sharding parameters: this rank's shard of them
  std::vector<device_array<Device, float>> hook_scratch_;  // the hook's (before the works: freed after them)
  std::vector<device_array<Device, float>> hook_state_;    // the hook's, saved in checkpoints
  std::optional<exact_sum<Comm, Device>> exact_;           // reduction::invariant's (before the works too)
  std::size_t pending_ = 0;                       // parameters still to report ready in this backward
  bucket_collectives<work_type> works_;           // in flight on this bucket
  bool held_ = false;                  // releasing: grads_ holds pool memory
  bool completed_ = false;             // this step's reduction completed
  bool local_ = false;                 // this step's gradients stay this rank's own (no collective)
  bool plain_sync_ = false;            // a sync reduced in f32 without the hook
  bool scatters_ = false;              // this step's reduction is the update policy's reduce_scatter
  control_route control_route_ = control_route::with_gradients;  // this step's control floats (the last bucket)
  bool plain_hook_ = false;            // the hook declares plain: it takes control floats routed with the gradients
};

}  // namespace ddp::detail
