#pragma once
// The gradient reducer: the buckets and a step's reduction of them.
//
//   ready tracking   which parameters the module reported in this step (any backward) and in the
//                    final one; a bucket whose parameters are all ready launches
//   launch order     buckets go strictly in index order, so every rank issues the same
//                    collectives in the same order whatever order its backward finishes in
//   completion       every bucket's reduction completes in bucket order: all of them at the end
//                    of the step's backward, or, when the update overlaps, each one as the update
//                    stage comes to it (complete_through)
//   step modes       join's shadow steps, a captured step (their rules: step_modes.hpp), the
//                    update overlapping the reductions
//
// Its parts own the rest: which parameters were used and the unused-parameter policy's ruling
// (parameter_usage.hpp), the control floats (control_channel.hpp), the memory of buckets held
// only while needed (memory_pool.hpp, gradient_residency.hpp, parameter_residency.hpp, and the
// module's layer hooks forwarding to them, residency_hooks.hpp), the plan and layout checks
// (bucket_layout.hpp) and the buckets' checkpoint sections (bucket_sections.hpp).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/core/error.hpp"
#include "ddp/policy/bucket_cap.hpp"
#include "ddp/policy/unused_params.hpp"
#include "ddp/trainer/bucket.hpp"
#include "ddp/trainer/bucket_layout.hpp"
#include "ddp/trainer/bucket_sections.hpp"
#include "ddp/trainer/completed_buckets.hpp"
#include "ddp/trainer/consensus.hpp"
#include "ddp/trainer/control_channel.hpp"
#include "ddp/trainer/gradient_residency.hpp"
#include "ddp/trainer/memory_held.hpp"
#include "ddp/trainer/memory_pool.hpp"
#include "ddp/trainer/parameter_residency.hpp"
#include "ddp/trainer/parameter_table.hpp"
#include "ddp/trainer/parameter_usage.hpp"
#include "ddp/trainer/parts.hpp"
#include "ddp/trainer/residency_hooks.hpp"
#include "ddp/trainer/step_modes.hpp"
#include "ddp/trainer/step_verdict.hpp"
#include "ddp/trainer/step_observer.hpp"

namespace ddp::detail {

template <communicator Comm, device Device>
class gradient_reducer final : bucket_completion {
 public:
  using bucket_type = bucket<Comm, Device>;

  // What the reducer is built with: the policies it calls, and what the module does.
  struct wiring {
    unused_params_part& unused_params;
    update_part& update;
    comm_hook_part<Device>& hook;
    const reduction_part& reduction;
    step_observer& observer;
    const std::uint64_t& steps;  // the trainer's step count
    bool reports = false;   // the module reports ready gradients
    module_binding bound;   // what of its memory it keeps in the buckets
  };

  // Places every parameter of `params` in its bucket (its grad, and value when bound, now point
  // into bucket memory). `place`: how the residencies point the module's tensors at memory.
  gradient_reducer(Comm& comm, Device& dev, parameter_table& params, const bucket_plan& plan, wiring w,
                   module_placement place = {})
      : comm_(comm), device_(dev), params_(params), w_(w), usage_(comm, dev, params, w.unused_params), pool_(dev),
        control_(comm, dev),
        gradients_(params, pool_, w.update, comm.rank(), std::move(place.gradient)),
        parameters_(dev, params, buckets_, pool_, w.update, comm.rank(), std::move(place.parameter)),
        hooks_(params, buckets_, gradients_, parameters_) {
    // Checked on every rank before any bucket is made; a fault on one rank is an error on all.
    std::vector<bucket_shape> shapes;
    const bucket_memory memory{.control = 1 + (w.reports ? usage_.control_floats() : 0),
                               .bound = w.bound,
                               .virtual_shards = w.reduction.virtual_shards()};
    const auto problem = shape_buckets(plan, params, w.update, memory, comm.rank(), comm.size(), shapes);
    agree_or_throw(comm, dev, problem, "construct",
                   "the bucket plan or the update policy's layout cannot be used; the trainer was not built");
    buckets_.reserve(shapes.size());
    for (const auto& shape : shapes) buckets_.emplace_back(comm, dev, w.hook, shape, plan.buckets[shape.index]);
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto& p = params[i];
      p.slot = plan.slots[i];
      auto& bk = buckets_[p.slot.bucket];
      if (p.type == dtype::f32) {
        float* in_bucket = bk.add_gradient(p.grad, p.slot.offset, p.numel);
        if (w.bound.gradients || bk.releases_gradients()) p.grad = in_bucket;  // nullptr until held
      } else {
        bk.add_half_gradient(p.module_grad, p.type, p.slot.offset, p.numel);
      }
      p.value = bk.add_value(p.value, p.slot.offset, p.numel, p.rows);
    }
  }
  gradient_reducer(const gradient_reducer&) = delete;
  gradient_reducer& operator=(const gradient_reducer&) = delete;
  ~gradient_reducer() { drain(); }
  // Waits for the collectives still in flight (a step that failed half-way), ignoring failures:
  // before bucket memory goes, or the module takes its storage back.
  void drain() noexcept {
    for (auto& bk : buckets_) bk.drain();
    control_.drain();
  }

  std::span<bucket_type> buckets() noexcept { return buckets_; }
  // The buckets for the update stage: each completed as it is reached (completed_buckets.hpp).
  completed_buckets<bucket_type> completed() noexcept { return {buckets_, *this, overlaps_update_}; }
  std::span<const bucket_type> buckets() const noexcept { return buckets_; }
  std::vector<std::size_t> bucket_sizes() const {
    std::vector<std::size_t> sizes;
    for (const auto& bk : buckets_) sizes.push_back(bk.numel());
    return sizes;
  }

  // Where the full gradients and the parameters live, and the module's layer hooks over both.
  gradient_residency<Comm, Device>& gradients() noexcept { return gradients_; }
  parameter_residency<Comm, Device>& parameters() noexcept { return parameters_; }
  const parameter_residency<Comm, Device>& parameters() const noexcept { return parameters_; }
  layer_hooks& hooks() noexcept { return hooks_; }
  // Which parameters were used, and which the optimizer updates (parameter_usage.hpp).
  const parameter_usage<Comm, Device>& usage() const noexcept { return usage_; }

  // The buckets' gradients and gathered parameters, and what the module keeps itself: values not
  // bound into the gathered copy, gradients neither bound nor placed (trainer/memory_held.hpp).
  memory_held memory() const noexcept {
    memory_held m;
    for (const auto& bk : buckets_) m.gradients += bk.gradient_bytes(), m.parameters += bk.parameter_bytes();
    m.gradients += pool_.bytes();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto& p = params_[i];
      const std::size_t bytes = p.numel * size_of(p.type);
      if (!w_.bound.values || p.type != dtype::f32) m.parameters += bytes;
      if (p.type != dtype::f32 || !(w_.bound.gradients || gradients_.active())) m.gradients += bytes;
    }
    return m;
  }

  // ---- a step --------------------------------------------------------------------------------

  // A micro-batch begins: parameters gathered between steps go (the layer hooks hold them again).
  void begin_micro_batch() {
    parameters_.release_all();
    ++micro_batches_;
  }
  // A micro-batch before the step's last ended. Under an exact sum its gradients are set aside and
  // the next starts from zero; otherwise they accumulate in place.
  void end_accumulated_micro_batch() {
    if (!w_.reduction.virtual_shards()) return;
    for (auto& bk : buckets_) gradients_.hold_all_of(bk);
    for (auto& bk : buckets_) bk.set_aside_micro_batch();
    for (auto& bk : buckets_) bk.zero_gradients();
  }
  // Micro-batches since the last update (this one included, from its start).
  std::size_t micro_batches() const noexcept { return micro_batches_; }
  // Inside join(): the step is the peers', this rank has nothing of its own to report.
  void set_shadowing(bool on) noexcept { shadowing_ = on; }
  // A sync schedule's local step (sync_stage.hpp): no collective; the unused-parameter policy sees
  // a world of this rank alone. Until end_step.
  void set_local(bool on) noexcept {
    local_ = on;
    usage_.set_local(on);
  }
  // Inside a captured step: nothing goes to or comes from the host (no control floats).
  void set_capturing(bool on) noexcept { capturing_ = on; }
  bool capturing() const noexcept { return capturing_; }

  // A backward begins; in the step's final one, buckets launch as their parameters report ready.
  void begin_backward(bool final) {
    backward_ran_ = true;
    collecting_ = final;
    if (!final) return;
    for (auto& bk : buckets_) bk.expect(bk.parameters().size());
    usage_.begin_final_backward();
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!usage_.expects_gradient(i)) unexpected(i);
    if (w_.reports) launch_ready();
  }
  void end_backward() noexcept { collecting_ = false; }

  // The module's ready sink: parameter i's gradient is final for this backward.
  void on_ready(std::size_t i) {
    if (usage_.report(i, collecting_) && buckets_[params_[i].slot.bucket].ready_one()) launch_ready();
  }

  // A module that cannot report counts every parameter as used.
  void mark_all_used() { usage_.mark_all_used(); }

  // Launches the buckets backward has not, then waits for every bucket's reduction; when the
  // update overlaps them, it waits for none (complete_through, bucket by bucket).
  void reduce_all() {
    // A rank whose step function ran no backward (no data of its own) contributes zeros, as before.
    if (w_.reports && backward_ran_ && !shadowing_ && params_.size() != 0 && !usage_.any_used())
      throw error("trainer", "step", comm_.rank(),
                  "the module reported no parameter ready in this step's backward, though it declares "
                  "reports_gradient_ready: its backward must call ready(i) (the ddp::ready_sink it is given) for "
                  "each parameter i whose gradient it wrote, once that gradient is final; a module that cannot "
                  "report drops reports_gradient_ready and runs under ddp::unused_params::unchecked");
    for (std::size_t b = next_launch_; b < buckets_.size(); ++b) launch(b);
    next_launch_ = buckets_.size();
    if (!overlaps_update_) complete_through(buckets_.size() - 1);
  }
  // Waits for the reductions of buckets up to `b` (those not yet complete, in bucket order); after
  // the last, the step's reductions go to the timeline and the overlap figures.
  void complete_through(std::size_t b) override {
    if (next_complete_ > b) return;
    {
      auto span = w_.observer.phase("wait for reductions", w_.steps);
      for (; next_complete_ <= b; ++next_complete_) complete(buckets_[next_complete_]);
    }
    if (next_complete_ < buckets_.size()) return;
    w_.observer.record_reductions(buckets_, w_.steps, w_.update.name(), w_.hook.plain() ? "" : w_.hook.name());
    if (!shadowing_ && !capturing_) w_.observer.measure_overlap(buckets_);
  }

  // The update runs bucket by bucket as their reductions complete, while later ones still
  // reduce (trainer.overlap_optimizer). Between steps, on every rank alike: the control floats
  // then go in a collective of their own.
  void overlap_update(bool on) {
    require_no_micro_batches("overlap_optimizer");
    overlaps_update_ = on;
  }
  bool overlaps_update() const noexcept { return overlaps_update_; }
  // After an overlapped update, before the step counts: on a stream backend (NCCL) the host waits
  // for the device and learns whether a collective it has not read back since (the last bucket's
  // reduction, a hook's, an all-gather) failed; a host backend's wait() has thrown already.
  void confirm_collectives() override {
    using work_type = typename bucket_type::work_type;
    if constexpr (stream_ordered_work<work_type>) {
      if (capturing_) return;  // a captured step reads nothing back (and a capture cannot wait)
      device_.synchronize();
      for (const auto& bk : buckets_) bk.rethrow_failures();
    }
  }

  // The averaged control floats are equal on every rank, so every rank decides alike: lets the
  // unused-parameter policy rule on what was used, and returns the step's verdict: the mean
  // micro-batch count (control_channel.hpp) and the parameters the optimizer updates.
  step_verdict read_control() {
    auto& last = buckets_.back();
    std::vector<float> control(last.control_floats());
    if (control_.sent()) {  // sent on their own (overlap_update)
      control_.read(control);
    } else {
      complete_through(buckets_.size() - 1);  // done already, unless the update overlaps one bucket
      last.read_control(control);
    }
    if (w_.reports && control[0] > 0.0f) try {
        usage_.rule(std::span<const float>(control).subspan(1));
      } catch (const collective_error& e) {  // a local step's is this rank's alone: the abort tells the peers
        drain();
        if (local_) throw error(e.backend(), e.operation(), e.rank(), e.detail());
        throw;
      } catch (...) {
        drain();  // overlapped: the buckets still reducing write into gradients the module holds
        throw;
      }
    return {control_.mean_micro_batches(control[0], w_.reduction.virtual_shards()), usage_.updated()};
  }

  void end_step() {
    if (next_complete_ < next_launch_) complete_through(next_launch_ - 1);  // a step no rank was active in
    for (auto& bk : buckets_) bk.clear_works();
    control_.end_step();
    next_launch_ = 0;
    next_complete_ = 0;
    micro_batches_ = 0;
    usage_.end_step();
    backward_ran_ = false;
    local_ = false;
    parameters_.release_stale();
  }

  void zero_gradients() {
    for (auto& bk : buckets_) bk.zero_gradients();
  }

  // Parameters the module keeps itself, under an update policy that gathers: the gathered copy
  // takes their values. Under one that keeps only its shard of them, this rank's shard is kept from
  // the gathered copy, which goes (the module's values are placed nowhere).
  void stage_values() {
    if (parameters_.active()) return parameters_.keep_shards();
    if (w_.update.memory().gathers_parameters() && !w_.bound.values)
      for (auto& bk : buckets_) bk.stage_values();
  }

  // The step's modes (step_modes.hpp): what runs between steps only, join(), capture.
  void require_no_micro_batches(const char* operation) const { detail::require_no_micro_batches(facts(), operation); }
  void require_joinable() const { detail::require_joinable(facts()); }
  std::optional<std::string> capture_refusal() const { return detail::capture_refusal(facts()); }
  // A captured step: each replay is this one micro-batch on every rank, updating every parameter.
  step_verdict reduce_captured_step() {
    require_replayable_step(facts(), usage_.used_flags(), params_);
    reduce_all();
    usage_.update_every_parameter();
    return {1.0f, usage_.updated()};
  }

  // ---- checkpoint sections (bucket_sections.hpp) --------------------------------------------

  void write_state(checkpoint_file& f) const { write_bucket_sections(f, buckets(), device_); }
  std::optional<std::string> check_buckets(const checkpoint_file& f) const { return check_bucket_layout(f, buckets()); }
  std::optional<std::string> check_hook_state(const checkpoint_file& f) const {
    return detail::check_hook_state(f, buckets_.size());
  }
  void read_state(const std::vector<checkpoint_file>& files) { read_hook_state(files, buckets(), device_); }

 private:
  // A parameter the unused-parameter policy expects no gradient for is not waited for.
  void unexpected(std::size_t i) { buckets_[params_[i].slot.bucket].ready_one(); }

  void launch_ready() {
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].ready()) launch(next_launch_++);
  }

  // The bucket's reduction completes; its full gradients go back to the pool when the policy keeps
  // only the shard.
  void complete(bucket_type& bk) {
    bk.complete_reduction(w_.steps);
    gradients_.release(bk);
  }

  void launch(std::size_t b) {
    const auto began = w_.observer.launch_begins();
    auto& bk = buckets_[b];
    gradients_.hold_all_of(bk);  // none got one
    std::vector<float> control;
    if (bk.control_floats() && !capturing_) {  // captured: every replay is one micro-batch on every rank, nothing read
      control.assign(bk.control_floats(), 0.0f);
      control[0] = static_cast<float>(micro_batches_);
      // A shadowing rank used nothing and broke no rule: its policy floats stay 0.
      if (w_.reports && !shadowing_) usage_.write_control(std::span(control).subspan(1));
    }
    if (local_) {
      bk.launch_local(control);
    } else {
      const bool f32_all_reduce = !w_.update.memory().scatters_gradients() && !w_.reduction.virtual_shards();
      const auto route =
          control_channel<Comm, Device>::route(!control.empty(), overlaps_update_, buckets_.size(), f32_all_reduce);
      if (route == control_route::own_first) control_.send(control);
      try {
        bk.launch(route == control_route::own_first ? std::span<const float>() : control, route, w_.hook.plain(), w_.steps);
      } catch (...) {
        drain();  // the buckets before it still reduce into memory the module holds
        throw;
      }
    }
    w_.observer.launched(b, buckets_.size(), began, w_.steps);
    if (b + 1 == buckets_.size()) usage_.set_all_buckets_sent(true);
    // Every rank launches in bucket order, so every rank completes the oldest at the same point.
    if (const std::size_t bound = gradients_.in_flight())
      for (; next_complete_ + bound <= b; ++next_complete_) complete(buckets_[next_complete_]);
  }

  step_mode_facts facts() const {
    return {w_.update.name(), parameters_.active(), gradients_.active(), w_.reduction.virtual_shards(),
            w_.hook.name(), w_.hook.capturable(), micro_batches_, comm_.rank()};
  }

  Comm& comm_;
  Device& device_;
  parameter_table& params_;
  wiring w_;
  parameter_usage<Comm, Device> usage_;
  std::vector<bucket_type> buckets_;
  memory_pool<Device> pool_;  // gradient and parameter memory held by no bucket now
  control_channel<Comm, Device> control_;
  gradient_residency<Comm, Device> gradients_;
  parameter_residency<Comm, Device> parameters_;
  residency_hooks<Comm, Device> hooks_;
  bool backward_ran_ = false;   // in this step, on this rank
  std::size_t next_launch_ = 0;
  std::size_t next_complete_ = 0;  // buckets [0, next_complete_) completed their reduction in this step
  std::size_t micro_batches_ = 0;
  bool collecting_ = false;  // inside the step's final backward
  bool shadowing_ = false;
  bool capturing_ = false;
  bool local_ = false;
  bool overlaps_update_ = false;
};

}  // namespace ddp::detail
