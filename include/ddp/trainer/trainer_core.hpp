#pragma once
// ddp::trainer_core<Module, Comm, Device>: the step's orchestration, compiled once per module,
// communicator and device whatever the policies (their parts: trainer/parts.hpp, by slot in
// trainer/slots.hpp). The state lives in the components the core owns (docs/design.md):
// run_counts, parameter_table, master_weights, buffer_set, gradient_reducer, update_stage,
// sync_stage, step_observer.
//
//   step(): [buffer sync] -> forward(s) -> backward -> ready reports -> reducer launches buckets
//           -> reduce -> unused-parameter rule -> update stage -> [gather] -> masters rounded
//
// A step may run any number of forwards and backwards (each backward pops the innermost
// forward); gradients are averaged over ranks and micro-batches, so the update equals one step
// on the concatenated global batch.
#include <array>
#include <cstdint>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/module.hpp"
#include "ddp/trainer/buffer_set.hpp"
#include "ddp/trainer/evaluation.hpp"
#include "ddp/trainer/gradient_reducer.hpp"
#include "ddp/trainer/master_weights.hpp"
#include "ddp/trainer/metrics.hpp"
#include "ddp/trainer/module_claim.hpp"
#include "ddp/trainer/parameter_table.hpp"
#include "ddp/trainer/replica.hpp"
#include "ddp/trainer/shard_buffers.hpp"
#include "ddp/trainer/slots.hpp"
#include "ddp/trainer/state_io.hpp"
#include "ddp/trainer/step_counts.hpp"
#include "ddp/trainer/step_guard.hpp"
#include "ddp/trainer/step_observer.hpp"
#include "ddp/trainer/step_tape.hpp"
#include "ddp/trainer/storage_return.hpp"
#include "ddp/trainer/sync_stage.hpp"
#include "ddp/trainer/update_stage.hpp"

namespace ddp {

template <class Module, class Comm, class Device>
class trainer_core {
  static_assert(diagnose_module<Module>());
  static_assert(Comm::memory_kind == Device::kind,
                "ddp: the communicator and the device disagree on where memory lives: an "
                "in-process or MPI communicator moves host memory, NCCL moves CUDA memory. Pair "
                "ddp::host::device with inproc/mpi, and ddp::cuda::device with nccl.");
  static constexpr bool reports = reports_gradient_ready<Module>;

 public:
  using module_type = Module;
  using communicator_type = Comm;
  using device_type = Device;
  using input_type = typename Module::input_type;
  using output_type = typename Module::output_type;
  using parts_type = detail::trainer_parts_ref<Device>;

  // What a step function works with (trainer/replica.hpp).
  using replica = detail::replica<trainer_core>;

  // Checks that every tensor is on the rank's device and that every rank holds the same model,
  // then broadcasts rank 0's parameters and buffers.
  trainer_core(Module& module, Comm& comm, Device& dev, parts_type parts)
      : module_(module), comm_(comm), device_(dev), claim_(&module, comm.rank()), parts_(parts),
        params_(module, comm, dev, optimizer_part().applies_update()),
        masters_(dev, params_),
        buffers_(comm, dev, params_.buffers()),
        reducer_(comm, dev, params_, bucket_part().plan(params_.numels()),
                 {unused_part(), update_part(), hook_part(), reduction_part(), observer_, counts_.current_step(), reports,
                  {.values = binds_values(), .gradients = binds_gradient_storage<Module>}},
                 detail::placement_of(module, update_part().memory())),
        update_(comm, dev, optimizer_part(), update_part().memory(), params_, reducer_.buckets(),
                /*exact_norm=*/reduction_part().virtual_shards() != 0),
        sync_(comm, dev, schedule_part(), reducer_.buckets()),
        storage_(module, params_, binds_values(), reducer_),
        shard_buffers_(module, comm, dev, buffers_, reduction_part().virtual_shards()) {
    sync_part().prepare(sync_context_);
    params_.broadcast(comm_, dev);
    masters_.copy_from_module();
    buffers_.broadcast(0);
    reducer_.stage_values();
    reducer_.zero_gradients();
  }
  trainer_core(const trainer_core&) = delete;
  trainer_core& operator=(const trainer_core&) = delete;
  // Collectives still in flight finish before the module gets its storage back.
  ~trainer_core() { reducer_.drain(); }

  // One micro-batch whose gradients accumulate without reduction (no communication).
  template <class F>
  decltype(auto) accumulate(F&& step_fn) { return run_micro_batch(std::forward<F>(step_fn), /*final=*/false); }

  // The last (or only) micro-batch: gradients are reduced while backward runs, averaged over
  // ranks and micro-batches, and the optimizer updates every parameter.
  template <class F>
  decltype(auto) step(F&& step_fn) { return run_micro_batch(std::forward<F>(step_fn), /*final=*/true); }

  // Join, for uneven inputs (docs/trainer.md): a rank out of batches calls join(), as does every
  // other after its last; until all have joined, a joined rank shadows the others' steps (their
  // collectives, zero gradients, the same update). Returns, on every rank in the same step, how
  // many steps this rank shadowed. Collective.
  std::size_t join() {
    guard_.run("join", [&] { reducer_.require_joinable(); });
    std::size_t shadowed = 0;
    while (shadow_step()) ++shadowed;
    return shadowed;
  }

  // Gradient clipping by global norm, and optimizer options per parameter group (the update
  // stage's: trainer/update_stage.hpp, docs/trainer.md).
  void clip_gradient_norm(float max_norm) { update_.clip_gradient_norm(max_norm); }
  double gradient_norm() const noexcept { return update_.gradient_norm(); }
  std::size_t set_parameter_group(const optim::parameter_selector& select, const optim::parameter_group& group) {
    return update_.set_parameter_group(select, group);
  }
  std::size_t parameter_group_count() const noexcept { return update_.group_count(); }
  // Each bucket updated as soon as its reduction completes, while later ones still reduce
  // (trainer/update_stage.hpp, docs/trainer.md); the same bits. Between steps, on every rank alike.
  void overlap_optimizer(bool on = true) { reducer_.overlap_update(on); }
  // update::fully_sharded: every parameter gathered into the module until the next step or
  // release_parameters(), to read or run the whole model (trainer/parameter_residency.hpp). Collective.
  bool gather_parameters() { return reducer_.parameters().gather_all(); }
  void release_parameters() { reducer_.parameters().release_all(); }

  // Zeroes this rank's gradients (not collective): for a module whose backward also runs outside
  // this trainer's steps, as a GAN's discriminator in the generator's step (PyTorch: D.zero_grad()).
  void zero_gradients() {
    tape_.require_outside_micro_batch("zero_gradients");
    reducer_.require_no_micro_batches("zero_gradients");
    reducer_.zero_gradients();
  }

  // Global sums of per-rank metrics: every rank gets the same values. Collective.
  // ddp::exact_metric sums the same bits however the terms were spread over the ranks.
  template <class Metric, std::size_t N>
  std::array<Metric, N> reduce(std::array<Metric, N> local) { return detail::reduce_metrics(comm_, device_, local); }
  metric reduce(metric m) { return reduce(std::array<metric, 1>{m})[0]; }
  exact_metric reduce(exact_metric m) { return reduce(std::array<exact_metric, 1>{m})[0]; }

  // Applies the buffer-sync policy now, e.g. before evaluating, so every rank evaluates with the
  // same running statistics (buffer_sync::none leaves each rank's own). Collective.
  void synchronize_buffers() {
    auto span = observer_.phase("buffer sync", steps());
    sync_part().synchronize(sync_context_);
  }

  // The sync schedule's pending sync now: every rank leaves with the same parameters (sync_stage.hpp).
  void sync_now() {
    between_steps("sync_now");
    guard_.run("sync_now", [&] { sync_.sync_now(steps(), reducer_.buckets()); masters_.round_into_module(); });
  }

  // A reduced evaluation over a whole data set, every sample counted once at any world size
  // (trainer/evaluation.hpp). Collective.
  template <class Loader, class F>
  auto evaluate(const Loader& loader, F&& per_batch) {
    return detail::evaluate(*this, module_, loader, std::forward<F>(per_batch), reduction_part().virtual_shards(),
                            reducer_.parameters());
  }

  Module& module() noexcept { return module_; }
  Comm& communicator() noexcept { return comm_; }
  const Comm& communicator() const noexcept { return comm_; }
  Device& device() noexcept { return device_; }
  // The optimizer's learning rate, for schedules (ddp::trainer::optimizer() has the rest).
  float& learning_rate() noexcept { return optimizer_part().learning_rate(); }
  std::uint64_t steps() const noexcept { return counts_.steps(); }
  std::size_t bucket_count() const noexcept { return reducer_.buckets().size(); }
  std::vector<std::size_t> bucket_sizes() const { return reducer_.bucket_sizes(); }
  const overlap_timing& last_step_overlap() const noexcept { return observer_.overlap(); }
  // What this rank's trainer holds on its device now, by kind (trainer/memory_held.hpp).
  memory_held memory() const noexcept {
    return reducer_.memory() + sync_.memory() +
           memory_held{.parameters = masters_.bytes(), .optimizer_state = update_.state_bytes()};
  }
  // Records every following step's phases into `t` (nullptr stops); ddp::write_chrome_trace
  // writes them (trainer/timeline.hpp). `t` must outlive the recording.
  void record_timeline(timeline* t) noexcept { observer_.record_into(t); }
  detail::step_observer& observer() noexcept { return observer_; }
  // Parameters the last step left to the optimizer unchanged because no rank used them.
  std::vector<std::string> skipped_parameters() const { return reducer_.usage().skipped_parameters(); }
  // Steps, micro-batches run (accumulate and step calls) and completed (trainer/step_counts.hpp).
  const detail::run_counts& counts() const noexcept { return counts_; }
  std::uint64_t micro_batches_run() const noexcept { return counts_.micro_batches_run(); }

  // ---- a step captured into a CUDA graph (ddp::cuda::step_graph) ----------------------------

  // What one step changes in the trainer's host state: replaying a captured step adds it.
  using captured_step = detail::step_counts;

  // Why this trainer's step cannot be captured now, or nothing: each component says what of its
  // own decides on the host per step.
  std::optional<std::string> capture_refusal() const {
    if (auto why = guard_.refusal()) return why;
    if (auto why = update_.capture_refusal()) return why;
    if (!schedule_part().every_step())
      return "sync schedule '" + std::string(schedule_part().name()) + "' decides per step whether gradients are "
             "reduced and when ranks sync, so no one captured step stands for every step";
    return reducer_.capture_refusal();
  }

  // One step(step_fn) whose device work is captured, not run: record(run) calls run() once,
  // between the start and the end of its capture. The counts the step advanced are put back
  // (also when it throws), and what it added is returned, for replayed().
  template <class F, class Record>
  captured_step capture(F&& step_fn, Record&& record) {
    if (const auto why = capture_refusal()) fail("capture", *why);
    const auto before = counts_.with(update_);
    reducer_.set_capturing(true);
    detail::at_scope_exit put_back([&] {
      reducer_.set_capturing(false);
      counts_.set(before, update_);
    });
    record([&] { step(step_fn); });
    return counts_.with(update_) - before;
  }
  // The captured step was queued once more.
  void replayed(const captured_step& added) { counts_.set(counts_.with(update_) += added, update_); }

  // This rank's state for a checkpoint, each component's sections (trainer/state_io.hpp);
  // between steps.
  detail::trainer_state<Comm, Device> checkpoint_state(const char* operation) {
    between_steps(operation);
    return last_step_state();
  }
  // What a rank hands over when its world fails (trainer/handoff.hpp): the last completed step's
  // state, without a sync schedule's fragments in flight (dropped on every rank alike).
  detail::trainer_state<Comm, Device> handover_state() {
    sync_.drop_in_flight();
    return last_step_state();
  }
  // The state of the last completed step, also when one failed half-way (the reductions still in
  // flight settled first): what a rank hands over when its world fails (trainer/handoff.hpp).
  detail::trainer_state<Comm, Device> last_step_state() {
    reducer_.drain();
    sync_.drain();
    return {device_, params_, masters_, buffers_, reducer_, update_, sync_, counts_.loaded_steps()};
  }

 private:
  friend replica;
  bool binds_values() const { return detail::binds_values<Module>(params_, update_part().memory().gathers_parameters()); }

  // The parts this core calls, by slot (trainer/slots.hpp).
  auto& sync_part() const noexcept { return parts_.template get<buffer_sync::slot>(); }
  auto& unused_part() const noexcept { return parts_.template get<unused_params::slot>(); }
  auto& bucket_part() const noexcept { return parts_.template get<buckets::slot>(); }
  auto& optimizer_part() const noexcept { return parts_.template get<optim::slot>(); }
  auto& update_part() const noexcept { return parts_.template get<update::slot>(); }
  auto& hook_part() const noexcept { return parts_.template get<comm_hook::slot>(); }
  auto& reduction_part() const noexcept { return parts_.template get<reduction::slot>(); }
  auto& schedule_part() const noexcept { return parts_.template get<sync_schedule::slot>(); }

  [[noreturn]] void fail(const char* operation, const std::string& what) const {
    throw error("trainer", operation, comm_.rank(), what);
  }
  void between_steps(const char* operation) const {
    if (reducer_.micro_batches() != 0 || tape_.in_last_backward())
      fail(operation, "called inside a step or after accumulate() without step(); call it between steps");
  }

  // ---- the step -----------------------------------------------------------------------------

  template <class F>
  decltype(auto) run_micro_batch(F&& step_fn, bool final) {
    const comm::step_scope tag_step(static_cast<std::int64_t>(steps()));
    if (reducer_.micro_batches() == 0) observer_.step_begins(steps());
    return guard_.run("step", [&]() -> decltype(auto) {
      if (reducer_.micro_batches() == 0) reducer_.set_local(sync_.local_step(steps())), sync_.before_step(reducer_.buckets());
      auto span = observer_.phase(final ? "step" : "accumulate", steps());
      tape_.begin_micro_batch(final);
      reducer_.begin_micro_batch();  // this one included: the control floats may go during its backward
      shard_buffers_.micro_batch_begins(steps(), reducer_.micro_batches() - 1);
      counts_.micro_batch_begins();
      replica r(*this, module_, comm_.rank());
      if constexpr (std::is_void_v<std::invoke_result_t<F&, replica&>>) {
        step_fn(r);
        end_micro_batch();
      } else {
        decltype(auto) result = step_fn(r);
        end_micro_batch();
        return result;
      }
    });
  }

  output_type forward(const input_type& x) {
    tape_.begin_forward();
    {
      auto span = observer_.phase("buffer sync", steps());
      sync_part().before_forward(sync_context_);
      if (tape_.forward_index() == 0) shard_buffers_.step_began();
    }
    auto span = observer_.phase("forward", steps());
    return module_.forward(x);
  }

  decltype(auto) backward(const output_type& grad_output) {
    const bool last = tape_.begin_backward();
    buffers_.check_saved(sync_part().name());
    reducer_.begin_backward(last);
    auto on_ready = [this](std::size_t i) { reducer_.on_ready(i); };
    auto span = observer_.phase("backward", steps());
    auto done = [&] {
      tape_.end_backward();
      reducer_.end_backward();
      if (last) observer_.backward_finished();
    };
    if constexpr (std::is_void_v<decltype(module_.backward(grad_output, std::declval<const ready_sink&>()))>) {
      module_.backward(grad_output, ready_sink(on_ready));
      done();
    } else {
      auto input_gradient = module_.backward(grad_output, ready_sink(on_ready));
      done();
      return input_gradient;
    }
  }

  void end_micro_batch() {
    if (!tape_.end_micro_batch()) return reducer_.end_accumulated_micro_batch();
    if (!reports) reducer_.mark_all_used();
    if (reducer_.capturing())  // nothing read on the host: each replay is this step, updating every parameter
      return finish_update(reducer_.reduce_captured_step());
    reducer_.reduce_all();
    const detail::step_verdict verdict = reducer_.read_control();
    shard_buffers_.step_ended();
    finish_update(verdict);
  }

  // One step with nothing of this rank's own (its step state is clear: end_step reset it); false,
  // and no update, when no rank was active.
  bool shadow_step() {
    const comm::step_scope tag_step(static_cast<std::int64_t>(steps()));
    observer_.step_begins(steps(), /*shadow=*/true);
    return guard_.run("join", [&] {
      auto span = observer_.phase("shadow step (join)", steps());
      reducer_.set_shadowing(true);
      sync_part().before_forward(sync_context_);  // as the active ranks' first forward
      reducer_.reduce_all();
      const detail::step_verdict verdict = reducer_.read_control();
      const bool active = verdict.mean_micro_batches > 0.0f;
      if (active) finish_update(verdict);
      else end_step();
      reducer_.set_shadowing(false);
      return active;
    });
  }

  void finish_update(detail::step_verdict verdict) {
    auto span = observer_.phase("update", steps());
    update_.run(reducer_.completed(), verdict, observer_, steps());
    try {  // a sync that fails changed nothing (sync_stage.hpp): the step's update stands, and counts
      auto sync = observer_.phase_if(!schedule_part().every_step(), "sync", steps());
      sync_.after_update(steps(), reducer_.buckets());
    } catch (...) {
      count_step();
      throw;
    }
    count_step();
  }
  void count_step() {
    masters_.round_into_module();
    end_step();
    counts_.step_counted();
  }

  void end_step() {
    reducer_.end_step();
    tape_.end_step();
    counts_.step_ends();
  }

  Module& module_;
  Comm& comm_;
  Device& device_;
  detail::module_claim claim_;  // before anything touches the module
  parts_type parts_;
  detail::run_counts counts_;  // steps, micro-batches run and completed
  detail::step_observer observer_;
  detail::parameter_table params_;
  detail::master_weights<Device> masters_;
  detail::buffer_set<Comm, Device> buffers_;
  detail::gradient_reducer<Comm, Device> reducer_;
  detail::update_stage<Comm, Device> update_;
  detail::sync_stage<Comm, Device> sync_;
  detail::storage_return<Module> storage_;  // after the reducer: gives the module its storage back first
  detail::shard_buffers<Module, Comm, Device> shard_buffers_;
  detail::step_tape tape_{comm_.rank()};
  detail::step_guard<Comm> guard_{comm_};
  detail::buffer_sync_context<Comm, Device> sync_context_{buffers_, counts_.current_step(), tape_.forward_index()};
};

}  // namespace ddp
