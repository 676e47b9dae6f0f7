#pragma once
// ddp::trainer<Module, Policies...>: N copies of a module on N ranks trained as one run on the
// global batch.
//
//   using trainer_t = ddp::trainer<my_model, ddp::buffer_sync::average_once_per_step,
//                                  ddp::unused_params::detect_each_step, ddp::optim::adamw>;
//   trainer_t trainer(model, comm, device, ddp::optim::adamw{.lr = 1e-3f});
//   trainer.step([&](auto& replica) {
//     auto out = replica.forward(x);
//     auto [loss, grad] = loss_fn(out, y);
//     replica.backward(grad);
//   });
//
// Policies go in any order; empty slots take defaults (see ddp/policy/*.hpp, ddp/optim,
// ddp/sampler, ddp/policy/engine.hpp). Construction checks that every tensor is on the rank's
// device (P3) and that every rank holds the same model (P5), then broadcasts rank 0's
// parameters and buffers. A step may run any number of forwards and backwards (each backward
// pops the innermost forward); gradients are averaged over ranks and micro-batches, so the
// update equals one step on the concatenated global batch.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <ranges>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/concepts/module.hpp"
#include "ddp/core/device_array.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/policy/bucket_cap.hpp"
#include "ddp/policy/buffer_sync.hpp"
#include "ddp/policy/engine.hpp"
#include "ddp/policy/unused_params.hpp"
#include "ddp/policy/update.hpp"
#include "ddp/sampler/sampler.hpp"
#include "ddp/trainer/bucket_plan.hpp"
#include "ddp/trainer/buffer_group.hpp"
#include "ddp/trainer/consensus.hpp"
#include "ddp/trainer/metrics.hpp"
#include "ddp/trainer/signature.hpp"

namespace ddp {

struct trainer_options {
  // Seeds the sampler's order; with the same seed every run visits the data identically.
  std::uint64_t seed = 0;
};

using trainer_slots =
    policy::slot_list<buffer_sync::slot, unused_params::slot, sampler::slot,
                      bucket_cap_detail::slot, optim::slot, update::slot,
                      engine_detail::communicator_slot, engine_detail::device_slot>;

// Checks on a combination of policies that are valid one by one.
template <class Module, class Comm, class Device, class Unused>
consteval bool valid_combination() {
  static_assert(Comm::memory_kind == Device::kind,
                "ddp: the communicator and the device disagree on where memory lives: an "
                "in-process or MPI communicator moves host memory, NCCL moves CUDA memory. Pair "
                "ddp::host::device with inproc/mpi, and ddp::cuda::device with nccl.");
  constexpr bool detects = !std::is_same_v<Unused, unused_params::forbid>;
  static_assert(!detects || reports_gradient_ready<Module>,
                "ddp: unused_params::detect_each_step and unused_params::static_graph need a "
                "module that reports ready gradients: declare `static constexpr bool "
                "reports_gradient_ready = true;` and call ready(i) in backward for every "
                "parameter that got a gradient; or use unused_params::forbid.");
  return true;
}

// Everything of the trainer but its sampler. Code that never asks for an epoch's indices (a step
// loop, an evaluation) can take a trainer_core& and serve every sampler policy with one
// instantiation; ddp::trainer below adds the sampler. The policies come in slot order.
template <class Module, class BufferSync, class UnusedParams, class BucketCap, class Optimizer,
          class Update, class Comm, class Device>
class trainer_core {
  static_assert(diagnose_module<Module>());

 public:
  using module_type = Module;
  using buffer_sync_policy = BufferSync;
  using unused_params_policy = UnusedParams;
  using optimizer_type = Optimizer;
  using update_policy = Update;
  using communicator_type = Comm;
  using device_type = Device;
  static constexpr std::size_t bucket_cap_bytes = BucketCap::bytes;
  static_assert(valid_combination<Module, communicator_type, device_type, unused_params_policy>());

  using input_type = typename Module::input_type;
  using output_type = typename Module::output_type;

  // What a step function works with: forward and backward of the module, with the trainer's
  // buffer synchronisation, readiness tracking and P1 checks around them.
  class replica {
   public:
    output_type forward(const input_type& x) { return t_.forward(x); }
    void backward(const output_type& grad_output) { t_.backward(grad_output); }
    Module& module() noexcept { return t_.module_; }
    int rank() const noexcept { return t_.comm_.rank(); }

   private:
    friend class trainer_core;
    explicit replica(trainer_core& t) : t_(t) {}
    trainer_core& t_;
  };

  trainer_core(Module& module, communicator_type& comm, device_type& dev, optimizer_type opt = {})
      : module_(module), comm_(comm), device_(dev), optimizer_(opt) {
    collect_tensors();
    check_devices();
    detail::check_same_model(comm_, device_, signature());
    build_buckets();
    group_buffers();
    broadcast_state();
    stage_values();
    zero_gradients();
  }

  trainer_core(const trainer_core&) = delete;
  trainer_core& operator=(const trainer_core&) = delete;

  // Collectives still in flight (a step that failed half-way) finish before bucket memory goes;
  // then the module gets its storage back (storage_return_).
  ~trainer_core() {
    for (auto& bk : buckets_)
      for (auto* w : {&bk.work, &bk.control_work, &bk.gather})
        if (*w) try {
            (*w)->wait();
          } catch (...) {
          }
  }

  // One micro-batch whose gradients accumulate without reduction (no communication).
  template <class F>
  decltype(auto) accumulate(F&& step_fn) {
    return run_micro_batch(std::forward<F>(step_fn), /*final=*/false);
  }

  // The last (or only) micro-batch: gradients are reduced while backward runs, averaged over
  // ranks and micro-batches, and the optimizer updates every parameter.
  template <class F>
  decltype(auto) step(F&& step_fn) {
    return run_micro_batch(std::forward<F>(step_fn), /*final=*/true);
  }

  // Global sums of per-rank metrics (P6): every rank gets the same values.
  template <std::size_t N>
  std::array<metric, N> reduce(std::array<metric, N> local) {
    std::array<double, 2 * N> flat;
    for (std::size_t i = 0; i < N; ++i) flat[2 * i] = local[i].sum, flat[2 * i + 1] = local[i].count;
    detail::host_all_reduce(comm_, device_, std::span<double>(flat), reduce_op::sum);
    for (std::size_t i = 0; i < N; ++i) local[i] = {flat[2 * i], flat[2 * i + 1]};
    return local;
  }
  metric reduce(metric m) { return reduce(std::array<metric, 1>{m})[0]; }

  // Applies the buffer-sync policy now, e.g. before evaluating, so every rank evaluates with the
  // same running statistics (buffer_sync::none leaves each rank's own). Collective.
  void synchronize_buffers() {
    if constexpr (!std::is_same_v<buffer_sync_policy, buffer_sync::none>) {
      for (auto& g : average_groups_)
        overwrite(g, [&](mutable_buffer b) { comm_.all_reduce(b, b, reduce_op::avg).wait(); });
      overwrite(broadcast_group_, [&](mutable_buffer b) { comm_.broadcast(b, 0).wait(); });
    }
  }

  Module& module() noexcept { return module_; }
  communicator_type& communicator() noexcept { return comm_; }
  const communicator_type& communicator() const noexcept { return comm_; }
  device_type& device() noexcept { return device_; }
  const optimizer_type& optimizer() const noexcept { return optimizer_; }
  optimizer_type& optimizer() noexcept { return optimizer_; }
  std::uint64_t steps() const noexcept { return steps_; }
  std::size_t bucket_count() const noexcept { return buckets_.size(); }
  std::vector<std::size_t> bucket_sizes() const {
    std::vector<std::size_t> s;
    for (const auto& b : buckets_) s.push_back(b.numel);
    return s;
  }
  const overlap_timing& last_step_overlap() const noexcept { return overlap_; }
  // Parameters the last step left to the optimizer unchanged because no rank used them.
  std::vector<std::string> skipped_parameters() const {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!update_[i]) names.push_back(params_[i].name);
    return names;
  }

  static std::string describe_policies() {
    return "buffer_sync=" + std::string(buffer_sync_policy::name) +
           ", unused_params=" + std::string(unused_params_policy::name) +
           ", bucket_cap=" + std::to_string(bucket_cap_bytes >> 10) + " KiB" +
           ", optimizer=" + optimizer_type::name + ", update=" + std::string(update_policy::name) +
           ", communicator=" + std::string(communicator_type::backend_name);
  }

 private:
  using work_type = decltype(std::declval<communicator_type&>().all_reduce(
      const_buffer{}, mutable_buffer{}, reduce_op::avg));
  static constexpr bool reports = reports_gradient_ready<Module>;
  static constexpr bool binds = binds_gradient_storage<Module>;
  static constexpr bool sharded = std::is_same_v<update_policy, update::sharded>;
  static constexpr bool binds_values = sharded && binds_parameter_storage<Module>;
  static constexpr std::size_t shard_alignment = 16;  // floats: every shard starts on a cache line
  static constexpr bool forbid = std::is_same_v<unused_params_policy, unused_params::forbid>;
  static constexpr bool detect_each = std::is_same_v<unused_params_policy, unused_params::detect_each_step>;
  static constexpr bool static_graph = std::is_same_v<unused_params_policy, unused_params::static_graph>;
  static constexpr bool sync_each_forward =
      std::is_same_v<buffer_sync_policy, buffer_sync::broadcast_each_forward>;
  using clock = std::chrono::steady_clock;

  struct param_info {
    std::string name;
    float* value = nullptr;
    float* grad = nullptr;  // where backward accumulates (bucket memory when bound)
    std::size_t numel = 0;
    shape_t shape;
    detail::bucket_slot slot;
  };
  struct buffer_info {
    std::string name;
    tensor_ref value;
    buffer_version* version = nullptr;
    std::uint64_t synced_at = 0;  // version right after the trainer last overwrote it
  };
  // Layout of grads (and, sharded, of values): the parameters' slots in [0, numel), zero padding
  // to ranks * shard, then `control` floats. Replicated: shard == numel, one rank's worth.
  struct bucket {
    std::vector<std::size_t> params;
    std::vector<segment> segments;  // module grad <-> bucket grads
    std::size_t numel = 0;
    std::size_t shard = 0;    // floats this rank updates, from shard_begin
    std::size_t shard_begin = 0;
    std::size_t padded = 0;   // shard * (ranks sharing the update)
    std::size_t control = 0;  // extra floats after the padding (last bucket only)
    device_array<device_type, float> grads;
    device_array<device_type, float> state;   // optimizer state of the shard, state_slots * shard
    device_array<device_type, float> values;  // sharded: the parameters, gathered here each step
    std::vector<segment> value_segments;      // sharded: module value <-> values
    std::size_t pending = 0;
    std::optional<work_type> work;          // the gradients' reduction
    std::optional<work_type> control_work;  // sharded: the control floats' all_reduce
    std::optional<work_type> gather;        // sharded: the updated parameters' all_gather
  };

  // The trainer points the module's gradients (and, sharded, its values) into bucket memory; this
  // hands the storage back to the module before the buckets go, also when construction fails.
  struct storage_return {
    Module* module = nullptr;
    std::size_t gradients = 0;  // parameters [0, gradients) have bound gradients
    std::size_t values = 0;     // parameters [0, values) have bound values
    storage_return() = default;
    storage_return(const storage_return&) = delete;
    storage_return& operator=(const storage_return&) = delete;
    ~storage_return() {
      try {
        if constexpr (binds)
          for (std::size_t i = 0; i < gradients; ++i) module->bind_gradient(i, nullptr);
        if constexpr (binds_values)
          for (std::size_t i = 0; i < values; ++i) module->bind_parameter(i, nullptr);
      } catch (...) {  // a module that cannot take storage back keeps dangling views; nothing else to do here
      }
    }
  };

  // ---- construction -------------------------------------------------------------------

  void collect_tensors() {
    for (auto&& p : module_.parameters()) {
      parameter_ref ref = p;
      if (ref.value.type != dtype::f32 || ref.grad.type != dtype::f32)
        fail_construct("parameter '" + ref.name + "' is " + std::string(name_of(ref.value.type)) +
                       " with a " + std::string(name_of(ref.grad.type)) +
                       " gradient; the trainer keeps f32 parameters and gradients (cast the "
                       "module to f32, or keep the other dtype as a buffer)");
      if (ref.grad.numel() != ref.value.numel())
        fail_construct("parameter '" + ref.name + "' has " + std::to_string(ref.value.numel()) +
                       " elements but its gradient " + std::to_string(ref.grad.numel()));
      params_.push_back({ref.name, static_cast<float*>(ref.value.data),
                         static_cast<float*>(ref.grad.data), ref.value.numel(), ref.value.shape, {}});
      param_refs_.push_back(std::move(ref));
    }
    if (params_.empty()) fail_construct("the module has no parameters: there is nothing to train");
    for (auto&& b : module_.buffers()) {
      buffer_ref ref = b;
      buffers_.push_back({ref.name, ref.value, ref.version, 0});
    }
    update_.assign(params_.size(), 1);
    used_.assign(params_.size(), 0);
    reported_.assign(params_.size(), 0);
    adam_steps_.assign(params_.size(), 0);
  }

  [[noreturn]] void fail_construct(const std::string& what) const {
    throw error("trainer", "construct", comm_.rank(), what);
  }

  // P3: every tensor must live on this rank's device; checked on every rank before any
  // collective touches a tensor, and reported on every rank.
  void check_devices() {
    const device_id mine = device_.id();
    std::optional<std::string> problem;
    auto check = [&](const std::string& what, const tensor_ref& t) {
      if (problem || t.numel() == 0) return;
      const device_id declared = t.device;
      const device_id actual = device_.locate(t.data).value_or(declared);
      if (declared != mine || actual != mine)
        problem = what + " lives on " + actual.to_string() + " but this rank's device is " +
                  mine.to_string() + "; move the module to the rank's device before building "
                  "the trainer (rank r uses the device its launcher binds, see docs/backends.md)";
    };
    for (const auto& p : param_refs_) {
      check("parameter '" + p.name + "'", p.value);
      check("the gradient of parameter '" + p.name + "'", p.grad);
    }
    for (const auto& b : buffers_) check("buffer '" + b.name + "'", b.value);
    detail::agree_or_throw(comm_, device_, problem, "construct",
                           "a tensor is not on its rank's device (pitfall P3)");
  }

  std::vector<detail::signature_entry> signature() const {
    std::vector<detail::signature_entry> s;
    for (const auto& p : param_refs_) s.push_back({"parameter", p.name, p.value.type, p.value.shape});
    for (const auto& b : buffers_) s.push_back({"buffer", b.name, b.value.type, b.value.shape});
    return s;
  }

  void build_buckets() {
    std::vector<std::size_t> numels;
    for (const auto& p : params_) numels.push_back(p.numel);
    auto plan = detail::plan_buckets(numels, bucket_cap_bytes);
    const std::size_t ranks = sharded ? static_cast<std::size_t>(comm_.size()) : 1;
    const std::size_t rank = sharded ? static_cast<std::size_t>(comm_.rank()) : 0;
    auto zeroed = [&](std::size_t n) {
      device_array<device_type, float> a(device_, n);
      device_.fill_zero(a.data(), n * sizeof(float));  // and the padding stays 0
      return a;
    };
    buckets_.resize(plan.buckets.size());
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      auto& bk = buckets_[b];
      bk.params = plan.buckets[b];
      bk.numel = plan.sizes[b];
      bk.shard = sharded ? (bk.numel + ranks * shard_alignment - 1) / (ranks * shard_alignment) * shard_alignment
                         : bk.numel;
      bk.shard_begin = rank * bk.shard;
      bk.padded = bk.shard * ranks;
      if (b + 1 == buckets_.size()) bk.control = control_size();
      bk.grads = zeroed(bk.padded + bk.control);
      bk.state = zeroed(bk.shard * static_cast<std::size_t>(optimizer_type::state_slots));
      if constexpr (sharded) bk.values = zeroed(bk.padded);
    }
    storage_return_.module = &module_;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      p.slot = plan.slots[i];
      auto& bk = buckets_[p.slot.bucket];
      if constexpr (binds) {
        p.grad = bk.grads.data() + p.slot.offset;
        module_.bind_gradient(i, p.grad);
        storage_return_.gradients = i + 1;
      }
      if constexpr (binds_values) {
        p.value = bk.values.data() + p.slot.offset;
        module_.bind_parameter(i, p.value);
        storage_return_.values = i + 1;
      }
      bk.segments.push_back({p.grad, p.slot.offset, p.numel});
      if constexpr (sharded) bk.value_segments.push_back({p.value, p.slot.offset, p.numel});
    }
  }

  // Sharded, parameters the module keeps itself: the gathered copy starts from rank 0's values.
  void stage_values() {
    if constexpr (sharded && !binds_values)
      for (auto& bk : buckets_) device_.pack(bk.value_segments, bk.values.data());
  }

  // Parameter i's part of this rank's shard of its bucket: where its values start, the offset
  // from the shard's start, the count (0 when none of it is in the shard).
  segment shard_segment(std::size_t i, const bucket& bk) const {
    const auto& p = params_[i];
    const std::size_t begin = std::max(p.slot.offset, bk.shard_begin);
    const std::size_t end = std::min(p.slot.offset + p.numel, bk.shard_begin + bk.shard);
    if (end <= begin) return {p.value, 0, 0};
    return {p.value + (begin - p.slot.offset), begin - bk.shard_begin, end - begin};
  }

  // The last bucket carries the unused-parameter check: one flag, or one flag per parameter.
  std::size_t control_size() const {
    if constexpr (!reports) return 0;
    else if constexpr (forbid) return 1;
    else return params_.size() + 1;
  }

  void broadcast_state() {
    for (auto& p : params_)
      comm_.broadcast(mutable_buffer{p.value, p.numel, dtype::f32}, 0).wait();
    detail::buffer_group<device_type> every_buffer(device_, dtype::u8);
    for (const auto& b : buffers_) every_buffer.add(b.value);
    overwrite(every_buffer, [&](mutable_buffer b) { comm_.broadcast(b, 0).wait(); });
  }

  // The buffer-sync policy's collectives, one per group: averaged floating buffers by dtype,
  // and everything broadcast as bytes.
  void group_buffers() {
    for (const auto& b : buffers_) {
      const bool average = std::is_same_v<buffer_sync_policy, buffer_sync::average_once_per_step> &&
                           is_floating(b.value.type);
      if (!average) {
        broadcast_group_.add(b.value);
        continue;
      }
      if (b.value.type != dtype::f32 && b.value.type != dtype::f64)
        fail_construct("buffer '" + b.name + "' is " + std::string(name_of(b.value.type)) +
                       "; buffer_sync::average_once_per_step averages f32 and f64 buffers (keep it in "
                       "f32, or use buffer_sync::broadcast_once_per_step)");
      auto it = std::find_if(average_groups_.begin(), average_groups_.end(),
                             [&](auto& g) { return g.members().front().type == b.value.type; });
      if (it == average_groups_.end()) it = average_groups_.insert(average_groups_.end(), {device_, b.value.type});
      it->add(b.value);
    }
  }

  // ---- the step -----------------------------------------------------------------------

  template <class F>
  decltype(auto) run_micro_batch(F&& step_fn, bool final) {
    if (broken_) throw error("trainer", "step", comm_.rank(), "the trainer is unusable after a "
                             "failed step: " + *broken_);
    final_ = final;
    replica r(*this);
    try {
      if constexpr (std::is_void_v<std::invoke_result_t<F&, replica&>>) {
        step_fn(r);
        end_micro_batch();
      } else {
        decltype(auto) result = step_fn(r);
        end_micro_batch();
        return result;
      }
    } catch (const collective_error& e) {
      broken_ = e.what();  // every rank raises this one: nobody waits
      throw;
    } catch (const std::exception& e) {
      // Peers may be waiting in a collective this rank will never issue: release them now.
      broken_ = e.what();
      comm_.abort(e.what());
      throw;
    }
  }

  output_type forward(const input_type& x) {
    sync_buffers_before_forward();
    ++tape_depth_;
    return module_.forward(x);
  }

  void backward(const output_type& grad_output) {
    if (tape_depth_ == 0)
      throw error("trainer", "backward", comm_.rank(),
                  "backward without a pending forward in this step: call replica.forward "
                  "before each replica.backward");
    check_saved_buffers();
    const bool last = tape_depth_ == 1 && final_;
    if (last) begin_final_backward();
    active_ = last;
    auto on_ready = [this](std::size_t i) { this->on_ready(i); };
    module_.backward(grad_output, ready_sink(on_ready));
    active_ = false;
    --tape_depth_;
    if (last) backward_done_ = clock::now();
  }

  void on_ready(std::size_t i) {
    if (i >= params_.size())
      throw error("trainer", "backward", comm_.rank(),
                  "the module reported parameter index " + std::to_string(i) + " ready, but it has " +
                      std::to_string(params_.size()) + " parameters");
    used_[i] = 1;
    if (!active_) return;
    if (reported_[i])
      throw error("trainer", "backward", comm_.rank(),
                  "parameter '" + params_[i].name + "' was reported ready twice in one backward; "
                  "report each parameter once, when its gradient is final");
    reported_[i] = 1;
    if (static_graph && learned_ && !learned_used_[i]) {
      // Counted as a change when the last bucket goes; after that it is too late to tell the
      // peers through it, so this rank fails and abort() tells them.
      if (next_launch_ == buckets_.size())
        throw error("trainer", "backward", comm_.rank(),
                    "parameter '" + params_[i].name + "' got a gradient, but "
                    "unused_params::static_graph learned in the first step that it is unused; "
                    "use ddp::unused_params::detect_each_step when the set of used parameters "
                    "changes between steps");
      return;
    }
    auto& bk = buckets_[params_[i].slot.bucket];
    if (--bk.pending == 0) launch_ready_buckets();
  }

  void begin_final_backward() {
    for (auto& bk : buckets_) bk.pending = bk.params.size();
    std::fill(reported_.begin(), reported_.end(), 0);
    if constexpr (static_graph) {
      if (learned_)
        for (std::size_t i = 0; i < params_.size(); ++i)
          if (!learned_used_[i]) --buckets_[params_[i].slot.bucket].pending;
    }
    if constexpr (reports) launch_ready_buckets();
  }

  // Buckets go strictly in index order, so every rank issues the same collectives in the same
  // order whatever order its backward finishes parameters in.
  void launch_ready_buckets() {
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0)
      launch(next_launch_++);
  }

  void launch(std::size_t b) {
    auto& bk = buckets_[b];
    if constexpr (!binds) device_.pack(bk.segments, bk.grads.data());
    if (bk.control) write_control(bk);
    float* g = bk.grads.data();
    if constexpr (sharded) {
      bk.work.emplace(comm_.reduce_scatter(const_buffer{g, bk.padded, dtype::f32},
                                           mutable_buffer{g + bk.shard_begin, bk.shard, dtype::f32}, reduce_op::avg));
      if (bk.control)
        bk.control_work.emplace(comm_.all_reduce(const_buffer{g + bk.padded, bk.control, dtype::f32},
                                                 mutable_buffer{g + bk.padded, bk.control, dtype::f32}, reduce_op::avg));
    } else {
      bk.work.emplace(comm_.all_reduce(const_buffer{g, bk.numel + bk.control, dtype::f32},
                                       mutable_buffer{g, bk.numel + bk.control, dtype::f32}, reduce_op::avg));
    }
  }

  // Control floats: [problem count, used flag per parameter (detecting policies)].
  void write_control(bucket& bk) {
    std::vector<float> control(bk.control, 0.0f);
    control[0] = static_cast<float>(local_problems());
    if constexpr (!forbid)
      for (std::size_t i = 0; i < params_.size(); ++i) control[1 + i] = used_[i] ? 1.0f : 0.0f;
    device_.copy_from_host(bk.grads.data() + bk.padded, control.data(), control.size() * sizeof(float));
  }

  // Parameters that break the policy on this rank: unused ones (forbid), changed ones
  // (static_graph after its first step).
  std::size_t local_problems() const {
    std::size_t n = 0;
    if constexpr (forbid) {
      for (auto u : used_) n += !u;
    } else if constexpr (static_graph) {
      if (learned_)
        for (std::size_t i = 0; i < params_.size(); ++i) n += (used_[i] != 0) != (learned_used_[i] != 0);
    }
    return n;
  }

  void end_micro_batch() {
    if (tape_depth_ != 0) {
      const auto n = tape_depth_;
      tape_depth_ = 0;
      throw error("trainer", "step", comm_.rank(),
                  std::to_string(n) + " forward(s) in this step had no backward; call "
                  "replica.backward once per forward, innermost first");
    }
    ++micro_batches_;
    if (!final_) return;
    if (!reports) std::fill(used_.begin(), used_.end(), 1);
    for (std::size_t b = next_launch_; b < buckets_.size(); ++b) launch(b);
    next_launch_ = buckets_.size();
    for (auto& bk : buckets_) {
      bk.work->wait();
      if (bk.control_work) bk.control_work->wait();
    }
    measure_overlap();
    if constexpr (reports) check_unused();
    finish_update();
  }

  void measure_overlap() {
    overlap_ = {};
    if constexpr (requires(work_type w) { w.started(); w.finished(); }) {
      for (auto& bk : buckets_) {
        const auto start = bk.work->started(), finish = bk.work->finished();
        overlap_.reduction_seconds += std::chrono::duration<double>(finish - start).count();
        const auto cut = std::min(finish, backward_done_);
        if (cut > start) overlap_.overlapped_seconds += std::chrono::duration<double>(cut - start).count();
      }
    }
  }

  void check_unused() {
    auto& last = buckets_.back();
    std::vector<float> control(last.control);
    device_.copy_to_host(control.data(), last.grads.data() + last.padded, control.size() * sizeof(float));
    if (control[0] > 0.0f) report_unused();
    if constexpr (!forbid) {
      if (!learned_ || detect_each) {
        for (std::size_t i = 0; i < params_.size(); ++i) update_[i] = control[1 + i] > 0.0f;
        if constexpr (static_graph) {
          learned_used_ = used_;
          learned_ = true;
        }
      }
    }
  }

  // Slow path, taken only when some rank broke the policy: gather what every rank used (and, for
  // static_graph, what it learned) and raise the same error on every rank.
  [[noreturn]] void report_unused() {
    const std::size_t n = params_.size();
    std::vector<std::uint8_t> mine(used_.begin(), used_.end());
    if constexpr (static_graph) mine.insert(mine.end(), learned_used_.begin(), learned_used_.end());
    const auto all = detail::host_all_gather(comm_, device_, std::span<const std::uint8_t>(mine));
    std::string list;
    for (std::size_t i = 0; i < n; ++i) {
      std::string ranks;
      for (int r = 0; r < comm_.size(); ++r) {
        const auto* row = all.data() + static_cast<std::size_t>(r) * mine.size();
        const bool problem = forbid ? !row[i] : (row[i] != 0) != (row[n + i] != 0);
        if (problem) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      }
      if (!ranks.empty())
        list += "\n  '" + params_[i].name + "' (" + (forbid ? "no gradient" : "use changed") + " on rank(s) " +
                ranks + ")";
    }
    if constexpr (forbid)
      throw collective_error("trainer", "step", comm_.rank(),
                  "parameters received no gradient in this step (pitfall P2):" + list +
                      "\nWith unused_params::forbid every parameter must get a gradient on every "
                      "rank in every step. Use ddp::unused_params::detect_each_step when the set "
                      "of used parameters changes between steps, or "
                      "ddp::unused_params::static_graph when it is fixed.");
    else
      throw collective_error("trainer", "step", comm_.rank(),
                  "the set of used parameters changed after the first step, which "
                  "unused_params::static_graph learned it in:" + list +
                      "\nUse ddp::unused_params::detect_each_step when the set changes between steps.");
  }

  void finish_update() {
    const float inv_micro = 1.0f / static_cast<float>(micro_batches_);
    for (auto& bk : buckets_) {
      if (micro_batches_ > 1) device_.scale(bk.grads.data() + bk.shard_begin, bk.shard, inv_micro);
      apply_optimizer(bk);
      zero_gradients(bk);
      if constexpr (sharded) gather_values(bk);
    }
    if constexpr (sharded)
      for (auto& bk : buckets_) {
        bk.gather->wait();
        if constexpr (!binds_values) device_.unpack(bk.value_segments, bk.values.data());
      }
    for (auto& bk : buckets_) bk.work.reset(), bk.control_work.reset(), bk.gather.reset();
    next_launch_ = 0;
    micro_batches_ = 0;
    std::fill(used_.begin(), used_.end(), 0);
    buffers_synced_ = false;
    ++steps_;
  }

  // Updates this rank's shard of the bucket (all of it when replicated); segment offsets, and
  // the gradient and state pointers, count from the shard's start.
  void apply_optimizer(bucket& bk) {
    std::vector<segment> segs;
    std::vector<std::int64_t> counts;  // AdamW: each parameter's own update count, as PyTorch
    for (const auto i : bk.params) {
      if (!update_[i]) continue;
      const auto count = ++adam_steps_[i];
      const segment part = shard_segment(i, bk);
      if (part.count == 0) continue;
      segs.push_back(part);
      counts.push_back(count);
    }
    if (segs.empty()) return;
    const float* grad = bk.grads.data() + bk.shard_begin;
    if constexpr (std::is_same_v<optimizer_type, optim::sgd>) {
      device_.sgd_update(segs, grad, bk.state.data(), optimizer_);
    } else {
      float* m = bk.state.data();
      float* v = bk.state.data() + bk.shard;
      for (std::size_t begin = 0, end; begin < segs.size(); begin = end) {
        for (end = begin + 1; end < segs.size() && counts[end] == counts[begin];) ++end;
        device_.adamw_update(std::span(segs).subspan(begin, end - begin), grad, m, v,
                             optimizer_, counts[begin]);
      }
    }
  }

  // Sharded: this rank's updated shard to every rank (copied in from the module first when the
  // module keeps its parameters itself).
  void gather_values(bucket& bk) {
    float* values = bk.values.data();
    if constexpr (!binds_values) {
      std::vector<segment> mine;
      for (const auto i : bk.params)
        if (const segment part = shard_segment(i, bk); part.count) mine.push_back(part);
      device_.pack(mine, values + bk.shard_begin);
    }
    bk.gather.emplace(comm_.all_gather(const_buffer{values + bk.shard_begin, bk.shard, dtype::f32},
                                       mutable_buffer{values, bk.padded, dtype::f32}));
  }

  void zero_gradients() {
    for (auto& bk : buckets_) zero_gradients(bk);
  }
  void zero_gradients(bucket& bk) {
    if constexpr (binds)
      device_.fill_zero(bk.grads.data(), bk.numel * sizeof(float));
    else
      for (const auto i : bk.params) device_.fill_zero(params_[i].grad, params_[i].numel * sizeof(float));
  }

  // ---- buffers ------------------------------------------------------------------------

  // Runs a collective over a group of buffers, then bumps their versions (the P1 check).
  template <class Collective>
  void overwrite(detail::buffer_group<device_type>& group, Collective collective) {
    group.apply(collective);
    for (const auto& t : group.members())
      for (auto& b : buffers_)
        if (b.value.data == t.data && b.version) {
          b.version->bump();
          b.synced_at = b.version->value();
        }
  }

  void sync_buffers_before_forward() {
    if (!sync_each_forward && buffers_synced_) return;
    buffers_synced_ = true;
    synchronize_buffers();
  }

  // P1: a backward must read each buffer it saved as its forward saw it.
  void check_saved_buffers() const {
    for (const auto& b : buffers_) {
      if (!b.version) continue;
      const auto saved = b.version->innermost_saved();
      if (!saved || *saved == b.version->value()) continue;
      if (b.synced_at > *saved)
        throw error("trainer", "backward", comm_.rank(),
                    "buffer '" + b.name + "' was saved for backward at version " +
                        std::to_string(*saved) + ", then buffer_sync::" +
                        std::string(buffer_sync_policy::name) +
                        " overwrote it before this backward (now version " +
                        std::to_string(b.version->value()) +
                        "), so the gradient would use values the forward never saw (pitfall "
                        "P1). Use ddp::buffer_sync::broadcast_once_per_step: it syncs buffers "
                        "once, before the step's first forward, so any number of forwards is safe.");
      throw error("trainer", "backward", comm_.rank(),
                  "buffer '" + b.name + "' was saved for backward at version " +
                      std::to_string(*saved) + " and modified since (now version " +
                      std::to_string(b.version->value()) +
                      ") by the module itself; do not write a buffer that a pending backward "
                      "still needs");
    }
  }

  Module& module_;
  communicator_type& comm_;
  device_type& device_;
  optimizer_type optimizer_;

  std::vector<parameter_ref> param_refs_;
  std::vector<param_info> params_;
  std::vector<buffer_info> buffers_;
  detail::buffer_group<device_type> broadcast_group_{device_, dtype::u8};
  std::vector<detail::buffer_group<device_type>> average_groups_;
  std::vector<bucket> buckets_;
  storage_return storage_return_;  // after buckets_: destroyed first

  // Per-step state.
  int tape_depth_ = 0;
  bool final_ = false;
  bool active_ = false;
  std::size_t next_launch_ = 0;
  std::size_t micro_batches_ = 0;
  bool buffers_synced_ = false;
  std::vector<char> used_;      // reported in any backward of this step
  std::vector<char> reported_;  // reported in the final backward
  clock::time_point backward_done_{};

  // Across steps.
  std::vector<char> update_;  // the optimizer updates parameter i
  bool learned_ = false;      // static_graph: first step done
  std::vector<char> learned_used_;
  std::vector<std::int64_t> adam_steps_;
  std::uint64_t steps_ = 0;
  overlap_timing overlap_;
  std::optional<std::string> broken_;
};

namespace detail {
// Sorts the policies into their slots; the policy checks fire here, before the core is
// instantiated (which checks the module).
template <class Module, class... Policies>
struct trainer_parts {
  using resolved = policy::resolve<trainer_slots, Policies...>;
  static_assert(resolved::valid, "ddp: see the policy error above");
  template <class Slot>
  using get = typename resolved::template get<Slot>;
  using sampler = get<sampler::slot>;
  using core = trainer_core<Module, get<buffer_sync::slot>, get<unused_params::slot>,
                            get<bucket_cap_detail::slot>, get<optim::slot>, get<update::slot>,
                            typename get<engine_detail::communicator_slot>::type,
                            typename get<engine_detail::device_slot>::type>;
};
}  // namespace detail

template <class Module, class... Policies>
class trainer : public detail::trainer_parts<Module, Policies...>::core {
  using parts = detail::trainer_parts<Module, Policies...>;

 public:
  using core_type = typename parts::core;
  using sampler_policy = typename parts::sampler;
  using typename core_type::communicator_type;
  using typename core_type::device_type;
  using typename core_type::optimizer_type;

  trainer(Module& module, communicator_type& comm, device_type& dev, optimizer_type opt = {},
          trainer_options options = {})
      : core_type(module, comm, dev, opt), options_(options) {}

  // This rank's indices for the next epoch; the trainer advances the epoch itself (P4).
  std::vector<std::size_t> next_epoch_indices(std::size_t dataset_size) {
    const auto& comm = this->communicator();
    return sampler_policy::indices(dataset_size, comm.rank(), comm.size(), options_.seed, epoch_++);
  }
  // Batches of a loader for the next epoch (a loader that shuffles on its own cannot be
  // combined with a distributed sampler, which already shuffles per epoch: P4).
  template <class Loader>
  auto epoch(Loader& loader) {
    static_assert(!(Loader::shuffles_itself && sampler_policy::is_distributed),
                  "ddp: this loader shuffles on its own, but the trainer's distributed sampler "
                  "already orders the data per epoch (pitfall P4); use a loader without a "
                  "shuffle of its own (ddp::data::loader<Dataset>), or sampler::contiguous");
    return loader.batches(next_epoch_indices(loader.dataset_size()));
  }
  std::uint64_t epochs_started() const noexcept { return epoch_; }
  // Steps this rank takes per epoch, equal on every rank.
  std::size_t steps_per_epoch(std::size_t dataset_size, std::size_t batch) const {
    return sampler_policy::per_rank(dataset_size, this->communicator().size()) / batch;
  }

  static std::string describe_policies() {
    return core_type::describe_policies() + ", sampler=" + std::string(sampler_policy::name);
  }

 private:
  trainer_options options_;
  std::uint64_t epoch_ = 0;
};

}  // namespace ddp
