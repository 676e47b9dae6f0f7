#pragma once
// ddp::trainer_core<Module, Comm, Device>: the step's orchestration, compiled once per module,
// communicator and device whatever the policies. The policies come in as parts
// (trainer/parts.hpp) that ddp::trainer (trainer.hpp) owns; every decision a policy makes is in
// the policy's own file.
//
//   step(): [buffer sync] -> forward(s) -> backward -> ready reports -> buckets -> reduce
//           -> unused-parameter rule -> optimizer -> [gather]
//
// Construction checks that every tensor is on the rank's device (P3) and that every rank holds
// the same model (P5), then broadcasts rank 0's parameters and buffers. A step may run any number
// of forwards and backwards (each backward pops the innermost forward); gradients are averaged
// over ranks and micro-batches, so the update equals one step on the concatenated global batch.
//
// Mixed precision: a parameter the module keeps in bf16 or f16 (with a gradient of the same
// dtype) is trained through an f32 master copy the trainer keeps: its gradient is widened into
// the f32 bucket, reduced there (in f32, or in 16 bits under comm_hook::bf16 / fp16), the
// optimizer updates the master, and the module's value is the master rounded after each step.
// Checkpoints hold the master.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <ranges>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/comm/host_collectives.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/loader.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/module.hpp"
#include "ddp/trainer/bucket.hpp"
#include "ddp/trainer/buffer_set.hpp"
#include "ddp/trainer/checkpoint_file.hpp"
#include "ddp/trainer/consensus.hpp"
#include "ddp/trainer/metrics.hpp"
#include "ddp/trainer/model_checks.hpp"
#include "ddp/trainer/parts.hpp"
#include "ddp/trainer/signature.hpp"
#include "ddp/trainer/storage_return.hpp"
#include "ddp/trainer/timeline.hpp"
#include "ddp/sampler/sampler.hpp"

namespace ddp {

template <class Module, class Comm, class Device>
class trainer_core {
  static_assert(diagnose_module<Module>());
  static_assert(Comm::memory_kind == Device::kind,
                "ddp: the communicator and the device disagree on where memory lives: an "
                "in-process or MPI communicator moves host memory, NCCL moves CUDA memory. Pair "
                "ddp::host::device with inproc/mpi, and ddp::cuda::device with nccl.");

 public:
  using module_type = Module;
  using communicator_type = Comm;
  using device_type = Device;
  using input_type = typename Module::input_type;
  using output_type = typename Module::output_type;
  using parts_type = detail::trainer_parts_ref<Device>;

  // What a step function works with: forward and backward of the module, with the trainer's
  // buffer synchronisation, readiness tracking and P1 checks around them.
  class replica {
   public:
    output_type forward(const input_type& x) { return t_.forward(x); }
    // Returns what the module's backward returns: nothing, or the gradient with respect to its
    // input for a module asked for it (ddp::nn::sequential::compute_input_gradient).
    decltype(auto) backward(const output_type& grad_output) { return t_.backward(grad_output); }
    Module& module() noexcept { return t_.module_; }
    int rank() const noexcept { return t_.comm_.rank(); }

   private:
    friend class trainer_core;
    explicit replica(trainer_core& t) : t_(t) {}
    trainer_core& t_;
  };

  trainer_core(Module& module, Comm& comm, Device& dev, parts_type parts)
      : module_(module), comm_(comm), device_(dev), parts_(parts), buffers_(comm, dev) {
    collect_tensors();
    detail::check_devices(comm_, device_, param_refs_, buffer_refs_);
    detail::check_shared_storage(comm_, device_, param_refs_);
    detail::check_same_model(comm_, device_, detail::signature_of(param_refs_, buffer_refs_));
    build_buckets();
    parts_.buffer_sync.prepare(sync_context_);
    broadcast_state();
    stage_values();
    for (auto& bk : buckets_) zero_gradients(bk);
  }

  trainer_core(const trainer_core&) = delete;
  trainer_core& operator=(const trainer_core&) = delete;

  // Collectives still in flight (a step that failed half-way) finish before bucket memory goes;
  // then the module gets its storage back (storage_return_).
  ~trainer_core() {
    for (auto& bk : buckets_) bk.drain();
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

  // Join, for uneven inputs: a rank that has run out of batches calls join(), and so does every
  // other rank after its last batch. Until every rank has joined, a joined rank shadows the steps
  // the others still take: it issues their collectives (buffer sync, every bucket) with nothing of
  // its own — zero gradients, no micro-batches — and applies the same update, so its replica stays
  // equal to theirs and each step equals one process over the batches of the ranks still active.
  // join() returns, on every rank in the same step, once a step finds no rank active; it returns
  // how many steps this rank shadowed. Collective. The peers' steps must issue the collectives of
  // one forward: every buffer-sync policy but broadcast_each_forward with several forwards.
  std::size_t join() {
    if (micro_batches_ != 0)  // their gradients would go in with nothing to count them
      guarded("join", [&] {
        throw error("trainer", "join", comm_.rank(),
                    std::to_string(micro_batches_) + " accumulate() micro-batch(es) have no step(); finish them "
                    "with step() before join()");
      });
    std::size_t shadowed = 0;
    while (shadow_step()) ++shadowed;
    return shadowed;
  }

  // Gradient clipping by global norm: from the next step on, the averaged gradient of the whole
  // model (every bucket, every rank's shard under update::sharded) is scaled by
  // max_norm / (norm + 1e-6) when its norm exceeds max_norm, before the optimizer runs, as
  // torch.nn.utils.clip_grad_norm_ does on one process. 0 turns it off (the default).
  void clip_gradient_norm(float max_norm) {
    if (!(max_norm >= 0.0f))
      throw error("trainer", "clip_gradient_norm", comm_.rank(),
                  "max_norm is " + std::to_string(max_norm) + "; give a positive norm, or 0 to stop clipping");
    max_gradient_norm_ = max_norm;
  }
  // The last step's averaged-gradient norm before clipping (0 until a step clipped, or while
  // clipping is off: it costs a pass over the gradients).
  double gradient_norm() const noexcept { return gradient_norm_; }

  // Optimizer options for the parameters whose name `select` accepts (their dotted names, as
  // errors print them): a learning-rate multiplier, a weight decay of their own. A later group
  // overrides an earlier one where both select a parameter. Returns how many it selected; one
  // that selects none is an error listing a few names. Call it on every rank alike (each rank
  // updates with its own copy of the options).
  std::size_t set_parameter_group(const optim::parameter_selector& select, const optim::parameter_group& group) {
    if (group.weight_decay && !parts_.optimizer.has_weight_decay())
      throw error("trainer", "set_parameter_group", comm_.rank(),
                  "the group sets weight_decay, but the optimizer has no `float weight_decay` member to replace");
    if (group_of_.empty()) group_of_.assign(params_.size(), 0);
    groups_.push_back(group);
    std::size_t selected = 0;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (select(params_[i].name)) group_of_[i] = groups_.size(), ++selected;
    if (selected == 0) {
      std::string names;
      for (std::size_t i = 0; i < params_.size() && i < 4; ++i) names += (i ? ", '" : "'") + params_[i].name + "'";
      throw error("trainer", "set_parameter_group", comm_.rank(),
                  "the selector matched no parameter; the names are like " + names);
    }
    return selected;
  }

  // Zeroes this rank's gradients (not collective). For a module whose backward also runs outside
  // this trainer's steps: the discriminator of a GAN, which the generator's step backpropagates
  // through, then holds gradients that are not its own step's (PyTorch: D.zero_grad()).
  void zero_gradients() {
    if (micro_batches_ != 0)
      throw error("trainer", "zero_gradients", comm_.rank(),
                  "called inside a step or after accumulate() without step(): it would discard " +
                      std::to_string(micro_batches_) + " micro-batch(es) of gradients; call it between steps");
    for (auto& bk : buckets_) zero_gradients(bk);
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
    detail::timeline_span span(timeline_, "buffer sync", steps_);
    parts_.buffer_sync.synchronize(sync_context_);
  }

  // A reduced evaluation over a whole data set (a test set), every sample counted once at any
  // world size: each rank takes its share as sampler::distributed<false, tail::pad> deals it,
  // in order, the padding weighing nothing, and the metrics are summed over the ranks.
  // per_batch(batch) returns a ddp::metric or a std::array of them (sums and counts, each sample
  // weighted by batch.weights: ddp::nn::softmax_cross_entropy's loss_sum, correct and samples).
  // The buffers are synchronised first, so every rank evaluates with the same running statistics,
  // and a module with train()/eval() evaluates in evaluation mode (forward saves nothing for a
  // backward; batch_norm uses its running statistics), its mode restored after. Collective.
  template <class Loader, class F>
  auto evaluate(const Loader& loader, F&& per_batch) {
    static_assert(loader_requirements::has_shard_batches<Loader>,
                  "ddp: evaluate() needs a loader with batches(const ddp::shard&), whose batches carry the "
                  "padding's weights (ddp::data::loader has it)");
    using in_order = sampler::distributed<false, sampler::tail::pad>;
    const auto shard = sampler::make_shard<in_order>(loader.dataset_size(), comm_.rank(), comm_.size(), 0, 0);
    synchronize_buffers();
    constexpr bool has_modes = requires { module_.eval(); module_.train(true); };
    bool was_training = true;
    if constexpr (requires { { module_.training() } -> std::convertible_to<bool>; }) was_training = module_.training();
    if constexpr (has_modes) module_.eval();
    using batch_reference = std::ranges::range_reference_t<decltype(loader.batches(shard))>;
    using result_type = std::remove_cvref_t<std::invoke_result_t<F&, batch_reference>>;
    result_type total{};
    try {
      for (const auto& b : loader.batches(shard)) detail::add_metrics(total, per_batch(b));
    } catch (...) {
      if constexpr (has_modes) module_.train(was_training);
      throw;
    }
    if constexpr (has_modes) module_.train(was_training);
    return reduce(total);
  }

  Module& module() noexcept { return module_; }
  Comm& communicator() noexcept { return comm_; }
  const Comm& communicator() const noexcept { return comm_; }
  Device& device() noexcept { return device_; }
  // The optimizer's learning rate, for schedules (ddp::trainer::optimizer() has the rest).
  float& learning_rate() noexcept { return parts_.optimizer.learning_rate(); }
  std::uint64_t steps() const noexcept { return steps_; }
  std::size_t bucket_count() const noexcept { return buckets_.size(); }
  std::vector<std::size_t> bucket_sizes() const {
    std::vector<std::size_t> s;
    for (const auto& b : buckets_) s.push_back(b.numel);
    return s;
  }
  const overlap_timing& last_step_overlap() const noexcept { return overlap_; }
  // Records every following step's phases into `t` (nullptr stops); ddp::write_chrome_trace
  // writes them (trainer/timeline.hpp). `t` must outlive the recording.
  void record_timeline(timeline* t) noexcept { timeline_ = t; }
  // Parameters the last step left to the optimizer unchanged because no rank used them.
  std::vector<std::string> skipped_parameters() const {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!update_[i]) names.push_back(params_[i].name);
    return names;
  }
  // Micro-batches run (accumulate and step calls), for the trainer's position in an epoch.
  std::uint64_t micro_batches_run() const noexcept { return micro_batches_run_; }

  // ---- a step captured into a CUDA graph (ddp::cuda::step_graph drives these) ------------

  // What one step changes in the trainer's host state: replaying a captured step adds it.
  struct step_increment {
    std::uint64_t steps = 0, micro_batches = 0;
    std::vector<std::int64_t> update_counts;
  };

  // Why this trainer's step cannot be captured now, or nothing. A captured step runs only device
  // work and collectives: nothing may be read on the host inside it.
  std::optional<std::string> capture_refusal() const {
    if (broken_) return "the trainer is unusable after a failed step: " + *broken_;
    if (micro_batches_ != 0) return "accumulate() micro-batches are waiting for their step(); capture between steps";
    if (!parts_.optimizer.applies_update())
      return "optim::external leaves the update to an optimizer outside the trainer, which the graph cannot hold";
    if (const auto varies = parts_.optimizer.rule_varies_with_step(); !varies || *varies)
      return varies ? "the optimizer's update rule changes with every update count (AdamW's bias correction), "
                      "but a captured step replays the rule it was captured with: use an optimizer whose rule "
                      "does not depend on the step (ddp::optim::sgd)"
                    : "the optimizer's rule has no operator==, so a captured step cannot tell whether it changes "
                      "with the update count: give the rule `bool operator==(const rule&) const = default;`";
    if (max_gradient_norm_ > 0.0f)
      return "gradient clipping reads the gradient norm on the host every step; clip_gradient_norm(0) to capture";
    if (!parts_.comm_hook.capturable())
      return "the communication hook '" + std::string(parts_.comm_hook.name()) +
             "' keeps host-side state per step; capture with comm_hook::none, fp16 or bf16";
    return std::nullopt;
  }

  // Between these two, run one step(): its device work is captured, not run. The host state
  // that step advanced is put back, and what it added is returned for replayed().
  step_increment begin_capture() {
    if (const auto why = capture_refusal()) throw error("trainer", "capture", comm_.rank(), *why);
    capturing_ = true;
    return {steps_, micro_batches_run_, update_counts_};
  }
  step_increment end_capture(const step_increment& before) {
    capturing_ = false;
    step_increment added{steps_ - before.steps, micro_batches_run_ - before.micro_batches, update_counts_};
    for (std::size_t i = 0; i < added.update_counts.size(); ++i) added.update_counts[i] -= before.update_counts[i];
    steps_ = before.steps, micro_batches_run_ = before.micro_batches, update_counts_ = before.update_counts;
    return added;
  }
  // The captured step was queued once more.
  void replayed(const step_increment& added) {
    steps_ += added.steps;
    micro_batches_run_ += added.micro_batches;
    for (std::size_t i = 0; i < update_counts_.size(); ++i) update_counts_[i] += added.update_counts[i];
  }
  std::size_t parameter_group_count() const noexcept { return groups_.size(); }

  // ---- checkpoints (ddp::trainer::save and load write and read the files) -----------------

  // This rank's state: parameters, buffers, its part of the optimizer state, each parameter's
  // update count (AdamW's bias correction), the step count, and the layout that gives the state
  // its meaning (the model's signature, each bucket's size and this rank's shard of it).
  void write_state(detail::checkpoint_file& f) {
    between_steps("save");
    std::string layout;
    for (const auto& bk : buckets_)
      layout += std::to_string(bk.numel) + " " + std::to_string(bk.padded) + " " + std::to_string(bk.shard_begin) +
                " " + std::to_string(bk.shard) + "\n";
    f.set_text("signature", detail::serialize(detail::signature_of(param_refs_, buffer_refs_)));
    f.set_text("buckets", layout);
    f.set_text("state_slots", std::to_string(parts_.optimizer.state_slots()));
    f.set_text("steps", std::to_string(steps_));
    f.set_array("update_counts", std::span<const std::int64_t>(update_counts_));
    for (const auto& p : params_) {
      std::vector<float> v(p.numel);
      device_.copy_to_host(v.data(), p.value, p.numel * sizeof(float));
      f.set_array("parameter/" + p.name, std::span<const float>(v));
    }
    for (const auto& b : buffers_.entries()) {
      std::vector<std::uint8_t> bytes(b.value.bytes());
      device_.copy_to_host(bytes.data(), b.value.data, bytes.size());
      f.set_bytes("buffer/" + b.name, std::move(bytes));
    }
    for (std::size_t i = 0; i < buckets_.size(); ++i) {
      const auto& bk = buckets_[i];
      std::vector<float> s(bk.state.size());
      if (!s.empty()) device_.copy_to_host(s.data(), bk.state.data(), s.size() * sizeof(float));
      f.set_array("state/" + std::to_string(i), std::span<const float>(s));
    }
    // The communication hook's state (PowerSGD's error feedback and factors): "bucket slot floats" per line.
    std::string hook_index;
    for (std::size_t i = 0; i < buckets_.size(); ++i)
      for (std::size_t k = 0; k < buckets_[i].hook_state.size(); ++k) {
        const auto& a = buckets_[i].hook_state[k];
        if (a.size() == 0) continue;
        std::vector<float> v(a.size());
        device_.copy_to_host(v.data(), a.data(), v.size() * sizeof(float));
        f.set_array(hook_state_name(i, k), std::span<const float>(v));
        hook_index += std::to_string(i) + " " + std::to_string(k) + " " + std::to_string(v.size()) + "\n";
      }
    if (!hook_index.empty()) f.set_text("hook_state", hook_index);
  }

  // Why `f` cannot be loaded into this trainer (another model, another bucket plan, another
  // optimizer's state), or nothing. Reads only; each rank checks the files it will read.
  std::optional<std::string> check_state(const detail::checkpoint_file& f) const {
    if (const auto d = detail::first_difference(detail::lines_of(f.text("signature")),
                                                detail::lines_of(detail::serialize(detail::signature_of(param_refs_, buffer_refs_)))))
      return "'" + f.path() + "' holds another model: its entry " + std::to_string(d->index) + " is " + d->first +
             ", this module's is " + d->second;
    std::string sizes;
    for (const auto& bk : buckets_) sizes += std::to_string(bk.numel) + " ";
    std::string theirs_sizes;
    for (const auto& row : parse_layout(f)) theirs_sizes += std::to_string(row[0]) + " ";
    if (sizes != theirs_sizes)
      return "'" + f.path() + "' was written with buckets of " + theirs_sizes + "elements, this trainer has " + sizes +
             "(another bucket_cap): build the trainer with the checkpoint's bucket_cap";
    const auto slots = std::to_string(parts_.optimizer.state_slots());
    if (f.text("state_slots") != slots)
      return "'" + f.path() + "' holds " + f.text("state_slots") + " optimizer state value(s) per parameter, this "
             "trainer's optimizer keeps " + slots;
    for (const auto& [bucket, slot, floats] : hook_state_index(f)) {
      if (bucket >= buckets_.size() || slot > 64)
        return "'" + f.path() + "' holds communication-hook state for bucket " + std::to_string(bucket) + " slot " +
               std::to_string(slot) + ", which this trainer does not have";
      const auto name = hook_state_name(bucket, slot);
      if (!f.has(name) || f.section(name).size() % sizeof(float) || f.section(name).size() / sizeof(float) != floats)
        return "'" + f.path() + "': its communication-hook state '" + hook_state_name(bucket, slot) +
               "' is missing or of another size than its index says";
    }
    return std::nullopt;
  }

  // Loads the state that `files` hold: `own` is the file whose parameters, buffers and counts
  // this rank takes; the optimizer state of each bucket is assembled from the files' shards,
  // which may be cut for another world size (update::sharded: the shards re-cut).
  void read_state(const std::vector<detail::checkpoint_file>& files, std::size_t own) {
    between_steps("load");
    const auto& f = files[own];
    for (auto& p : params_) {
      const auto v = f.array<float>("parameter/" + p.name, p.numel);
      device_.copy_from_host(p.value, v.data(), p.numel * sizeof(float));
    }
    stage_values();
    round_masters_into_module();
    for (const auto& b : buffers_.entries()) {
      const auto& bytes = f.section("buffer/" + b.name);
      if (bytes.size() != b.value.bytes())
        throw error("trainer", "load", comm_.rank(), "'" + f.path() + "': buffer '" + b.name + "' has another size");
      device_.copy_from_host(b.value.data, bytes.data(), bytes.size());
      if (b.version) b.version->bump();
    }
    update_counts_ = f.array<std::int64_t>("update_counts", params_.size());
    steps_ = f.number("steps");
    const auto slots = static_cast<std::size_t>(parts_.optimizer.state_slots());
    std::vector<std::vector<std::array<std::size_t, 4>>> layouts;
    for (const auto& file : files) layouts.push_back(parse_layout(file));
    for (std::size_t i = 0; i < buckets_.size(); ++i) {
      auto& bk = buckets_[i];
      std::vector<float> mine(bk.state.size(), 0.0f);
      for (std::size_t j = 0; j < files.size(); ++j) {  // each file's shard [begin, begin + shard) of every slot
        const auto& file = files[j];
        const std::size_t begin = layouts[j].at(i)[2], shard = layouts[j].at(i)[3];
        const auto theirs = file.array<float>("state/" + std::to_string(i), slots * shard);
        const std::size_t lo = std::max(begin, bk.shard_begin), hi = std::min(begin + shard, bk.shard_begin + bk.shard);
        for (std::size_t k = 0; k < slots && lo < hi; ++k)
          std::copy(theirs.begin() + static_cast<std::ptrdiff_t>(k * shard + lo - begin),
                    theirs.begin() + static_cast<std::ptrdiff_t>(k * shard + hi - begin),
                    mine.begin() + static_cast<std::ptrdiff_t>(k * bk.shard + lo - bk.shard_begin));
      }
      if (!mine.empty()) device_.copy_from_host(bk.state.data(), mine.data(), mine.size() * sizeof(float));
    }
    // The hook's state is this rank's own (error feedback): restored at the same world size, and
    // started afresh at another.
    for (auto& bk : buckets_) bk.hook_state.clear();
    if (files.size() == 1)
      for (const auto& [bucket, slot, floats] : hook_state_index(f)) {
        auto& arrays = buckets_[bucket].hook_state;
        if (arrays.size() <= slot) arrays.resize(slot + 1);
        arrays[slot] = device_array<Device, float>(device_, floats);
        const auto v = f.array<float>(hook_state_name(bucket, slot), floats);
        device_.copy_from_host(arrays[slot].data(), v.data(), floats * sizeof(float));
      }
    device_.synchronize();
  }

 private:
  static std::string hook_state_name(std::size_t bucket, std::size_t slot) {
    return "hook_state/" + std::to_string(bucket) + "/" + std::to_string(slot);
  }
  // N numbers per row ("1 2 3\n4 5 6\n"), as rows.
  template <std::size_t N>
  static std::vector<std::array<std::size_t, N>> number_rows(const std::string& text) {
    std::vector<std::array<std::size_t, N>> rows;
    std::istringstream in(text);
    for (std::array<std::size_t, N> r{};;) {
      for (auto& v : r)
        if (!(in >> v)) return rows;
      rows.push_back(r);
    }
  }
  // A checkpoint's communication-hook state: bucket, slot, floats of each (none before hooks kept state).
  static std::vector<std::array<std::size_t, 3>> hook_state_index(const detail::checkpoint_file& f) {
    if (!f.has("meta/hook_state")) return {};
    return number_rows<3>(f.text("hook_state"));
  }
  // Each bucket's row of a checkpoint's layout: numel, padded, shard begin, shard.
  static std::vector<std::array<std::size_t, 4>> parse_layout(const detail::checkpoint_file& f) {
    return number_rows<4>(f.text("buckets"));
  }
  void between_steps(const char* operation) const {
    if (micro_batches_ != 0 || active_)
      throw error("trainer", operation, comm_.rank(),
                  "called inside a step or after accumulate() without step(); call it between steps");
  }

  static constexpr bool reports = reports_gradient_ready<Module>;
  static constexpr bool binds = binds_gradient_storage<Module>;
  using bucket = detail::bucket<Comm, Device>;
  using clock = std::chrono::steady_clock;

  struct param_info {
    std::string name;
    float* value = nullptr;  // the f32 value the optimizer updates: the module's, or its master copy
    float* grad = nullptr;   // f32: where backward accumulates (bucket memory when bound); 16-bit: none
    std::size_t numel = 0;
    bucket_slot slot;
    dtype type = dtype::f32;  // the module's
    void* module_value = nullptr;  // 16-bit parameters: the module's own value and gradient
    void* module_grad = nullptr;
  };

  // ---- construction -------------------------------------------------------------------

  void collect_tensors() {
    std::size_t master_floats = 0;
    for (auto&& p : module_.parameters()) {
      parameter_ref ref = p;
      const dtype type = ref.value.type;
      if ((type != dtype::f32 && !is_half(type)) || ref.grad.type != type)
        fail_construct("parameter '" + ref.name + "' is " + std::string(name_of(type)) + " with a " +
                       std::string(name_of(ref.grad.type)) +
                       " gradient; the trainer trains f32 parameters, and bf16 or f16 ones through an f32 master "
                       "copy, each with a gradient of its own dtype (cast the parameter, or keep the other dtype "
                       "as a buffer)");
      if (ref.grad.numel() != ref.value.numel())
        fail_construct("parameter '" + ref.name + "' has " + std::to_string(ref.value.numel()) +
                       " elements but its gradient " + std::to_string(ref.grad.numel()));
      param_info info{ref.name, nullptr, nullptr, ref.value.numel(), {}, type};
      if (type == dtype::f32) {
        info.value = static_cast<float*>(ref.value.data);
        info.grad = static_cast<float*>(ref.grad.data);
      } else {
        info.module_value = ref.value.data;
        info.module_grad = ref.grad.data;
        master_floats += info.numel;
      }
      params_.push_back(std::move(info));
      param_refs_.push_back(std::move(ref));
    }
    if (params_.empty()) fail_construct("the module has no parameters: there is nothing to train");
    if (master_floats && !parts_.optimizer.applies_update())
      fail_construct("parameter '" + first_half_parameter().name + "' is " +
                     std::string(name_of(first_half_parameter().type)) +
                     ", trained through the trainer's f32 master copy, but optim::external leaves the update to "
                     "your optimizer, which would step the 16-bit values themselves: use a trainer optimizer "
                     "(ddp::optim::sgd, adamw), or give the module f32 parameters");
    if (master_floats) masters_ = device_array<Device, float>(device_, master_floats);
    float* next_master = masters_.data();
    for (auto& p : params_)
      if (p.type != dtype::f32) p.value = std::exchange(next_master, next_master + p.numel);
    for (auto&& b : module_.buffers()) {
      buffer_ref ref = b;
      buffers_.add(ref);
      buffer_refs_.push_back(std::move(ref));
    }
    update_.assign(params_.size(), 1);
    used_.assign(params_.size(), 0);
    reported_.assign(params_.size(), 0);
    update_counts_.assign(params_.size(), 0);
  }

  const param_info& first_half_parameter() const {
    return *std::find_if(params_.begin(), params_.end(), [](const auto& p) { return p.type != dtype::f32; });
  }

  [[noreturn]] void fail_construct(const std::string& what) const {
    throw error("trainer", "construct", comm_.rank(), what);
  }

  void build_buckets() {
    std::vector<std::size_t> numels;
    for (const auto& p : params_) numels.push_back(p.numel);
    const auto plan = parts_.buckets.plan(numels);
    const bool gathers = parts_.update.gathers_parameters();
    // 16-bit parameters keep their f32 master in the trainer: then every value is copied in and out.
    const bool binds_values = gathers && binds_parameter_storage<Module> && masters_.size() == 0;
    const auto slots = static_cast<std::size_t>(parts_.optimizer.state_slots());
    auto zeroed = [&](std::size_t n) {
      device_array<Device, float> a(device_, n);
      device_.fill_zero(a.data(), n * sizeof(float));  // and the padding stays 0
      return a;
    };
    buckets_.resize(plan.buckets.size());
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      auto& bk = buckets_[b];
      bk.comm = &comm_;
      bk.device = &device_;
      bk.hook = &parts_.comm_hook;
      bk.steps = &steps_;
      bk.index = b;
      bk.binds_values = binds_values;
      bk.params = plan.buckets[b];
      bk.numel = plan.sizes[b];
      const auto layout = parts_.update.plan(bk.numel, comm_.rank(), comm_.size());
      bk.shard = layout.shard;
      bk.shard_begin = layout.begin;
      bk.padded = layout.padded;
      // The last bucket carries this rank's micro-batch count, then the unused-parameter policy's floats.
      if (b + 1 == buckets_.size())
        bk.control = 1 + (reports ? parts_.unused_params.control_floats(params_.size()) : 0);
      bk.grads = zeroed(bk.padded + bk.control);
      bk.state = zeroed(bk.shard * slots);
      if (gathers) bk.values = zeroed(bk.padded);
    }
    storage_return_.module = &module_;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      p.slot = plan.slots[i];
      auto& bk = buckets_[p.slot.bucket];
      if (p.type != dtype::f32) {  // widened into the bucket at launch, no binding
        bk.half_grads.push_back({p.module_grad, p.type, p.slot.offset, p.numel});
      } else {
        if constexpr (binds) {
          p.grad = bk.grads.data() + p.slot.offset;
          module_.bind_gradient(i, p.grad);
          storage_return_.gradients.push_back(i);
        }
        bk.segments.push_back({p.grad, p.slot.offset, p.numel});
      }
      if constexpr (binds_parameter_storage<Module>) {
        if (binds_values) {
          p.value = bk.values.data() + p.slot.offset;
          module_.bind_parameter(i, p.value);
          storage_return_.values.push_back(i);
        }
      }
      bk.value_segments.push_back({p.value, p.slot.offset, p.numel});
      const auto& shape = param_refs_[i].value.shape;
      const std::size_t rows = shape.empty() || p.numel == 0 ? 1 : static_cast<std::size_t>(shape[0]);
      bk.tensors.push_back({p.slot.offset, rows, p.numel / rows});
    }
  }

  // Parameters the module keeps itself, under an update policy that gathers: the gathered copy
  // starts from rank 0's values.
  void stage_values() {
    if (parts_.update.gathers_parameters() && !(binds_parameter_storage<Module>))
      for (auto& bk : buckets_) device_.pack(bk.value_segments, bk.values.data());
  }

  void broadcast_state() {
    for (auto& p : params_)
      comm_.broadcast(p.type == dtype::f32 ? mutable_buffer{p.value, p.numel, dtype::f32}
                                           : mutable_buffer{p.module_value, p.numel, p.type},
                      0)
          .wait();
    for (auto& p : params_)  // the master copies start from the module's values, exactly
      if (p.type != dtype::f32)
        device_.cast(const_buffer{p.module_value, p.numel, p.type}, mutable_buffer{p.value, p.numel, dtype::f32});
    buffers_.broadcast(0);
  }

  // The module's 16-bit values: its master copies, rounded to nearest even.
  void round_masters_into_module() {
    for (auto& p : params_)
      if (p.type != dtype::f32)
        device_.cast(const_buffer{p.value, p.numel, dtype::f32}, mutable_buffer{p.module_value, p.numel, p.type});
  }

  // ---- what the policies see ----------------------------------------------------------

  struct sync_context final : buffer_sync::context {
    explicit sync_context(trainer_core& t) : t(t) {}
    trainer_core& t;
    std::uint64_t step() const noexcept override { return t.steps_; }
    std::size_t forward_index() const noexcept override { return t.forwards_; }
    void broadcast_buffers(int root) override { t.buffers_.broadcast(root); }
    void average_buffers() override { t.buffers_.average(); }
    void require_averageable() override { t.buffers_.require_averageable(); }
  };

  struct unused_view final : unused_params::step_view {
    explicit unused_view(trainer_core& t) : t(t) {}
    trainer_core& t;
    std::size_t parameter_count() const noexcept override { return t.params_.size(); }
    const std::string& parameter_name(std::size_t i) const override { return t.params_[i].name; }
    bool used(std::size_t i) const noexcept override { return t.used_[i] != 0; }
    bool all_buckets_sent() const noexcept override { return t.next_launch_ == t.buckets_.size(); }
    int rank() const noexcept override { return t.comm_.rank(); }
    int size() const noexcept override { return t.comm_.size(); }
    std::vector<std::uint8_t> all_gather(std::span<const std::uint8_t> mine) override {
      return detail::host_all_gather(t.comm_, t.device_, mine);
    }
  };

  // ---- the step -----------------------------------------------------------------------

  // Runs one step's work (`operation` names it in errors). A failure leaves the trainer unusable
  // and, unless every rank raised it alike, aborts the communicator: peers may be waiting in a
  // collective this rank will never issue.
  template <class F>
  decltype(auto) guarded(const char* operation, F&& work) {
    if (broken_)
      throw error("trainer", operation, comm_.rank(), "the trainer is unusable after a failed step: " + *broken_);
    try {
      return work();
    } catch (const collective_error& e) {
      broken_ = e.what();  // every rank raises this one: nobody waits
      throw;
    } catch (const std::exception& e) {
      broken_ = e.what();
      comm_.abort(e.what());
      throw;
    }
  }

  template <class F>
  decltype(auto) run_micro_batch(F&& step_fn, bool final) {
    return guarded("step", [&]() -> decltype(auto) {
      detail::timeline_span span(timeline_, final ? "step" : "accumulate", steps_);
      final_ = final;
      sent_ = false;
      ++micro_batches_;  // this one included, from its start: the control floats may go during its backward
      ++micro_batches_run_;
      replica r(*this);
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
    if (sent_)  // its backward would add to gradients already on their way
      throw error("trainer", "forward", comm_.rank(),
                  "a forward after this step's last backward, whose gradients are already being reduced: "
                  "run every forward of a step before its backwards (innermost first), or give each "
                  "forward-backward pair its own accumulate() and end with step()");
    {
      detail::timeline_span span(timeline_, "buffer sync", steps_);
      parts_.buffer_sync.before_forward(sync_context_);
    }
    ++forwards_;
    ++tape_depth_;
    detail::timeline_span span(timeline_, "forward", steps_);
    return module_.forward(x);
  }

  decltype(auto) backward(const output_type& grad_output) {
    if (tape_depth_ == 0)
      throw error("trainer", "backward", comm_.rank(),
                  "backward without a pending forward in this step: call replica.forward "
                  "before each replica.backward");
    buffers_.check_saved(parts_.buffer_sync.name());
    const bool last = tape_depth_ == 1 && final_;
    if (last) begin_final_backward();
    sent_ = sent_ || last;
    active_ = last;
    auto on_ready = [this](std::size_t i) { this->on_ready(i); };
    detail::timeline_span span(timeline_, "backward", steps_);
    auto done = [&] {
      active_ = false;
      --tape_depth_;
      if (last) backward_done_ = clock::now();
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
    if (!parts_.unused_params.expects_gradient(i)) {
      parts_.unused_params.on_unexpected_gradient(unused_view_, i);
      return;
    }
    auto& bk = buckets_[params_[i].slot.bucket];
    if (--bk.pending == 0) launch_ready_buckets();
  }

  void begin_final_backward() {
    for (auto& bk : buckets_) bk.pending = bk.params.size();
    std::fill(reported_.begin(), reported_.end(), 0);
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!parts_.unused_params.expects_gradient(i)) --buckets_[params_[i].slot.bucket].pending;
    if constexpr (reports) launch_ready_buckets();
  }

  // Buckets go strictly in index order, so every rank issues the same collectives in the same
  // order whatever order its backward finishes parameters in.
  void launch_ready_buckets() {
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) launch(next_launch_++);
  }

  void launch(std::size_t b) {
    const auto began = timeline_ ? clock::now() : clock::time_point{};
    auto& bk = buckets_[b];
    if constexpr (!binds) device_.pack(bk.segments, bk.grads.data());
    for (const auto& h : bk.half_grads)
      device_.cast(const_buffer{h.tensor, h.count, h.type}, mutable_buffer{bk.grads.data() + h.offset, h.count, dtype::f32});
    if (bk.control && !capturing_) {  // captured: every replay is one micro-batch on every rank, nothing read
      std::vector<float> control(bk.control, 0.0f);
      control[0] = static_cast<float>(micro_batches_);
      // A shadowing rank used nothing and broke no rule: its policy floats stay 0.
      if constexpr (reports)
        if (!shadowing_) parts_.unused_params.write_control(unused_view_, std::span(control).subspan(1));
      device_.copy_from_host(bk.grads.data() + bk.padded, control.data(), control.size() * sizeof(float));
    }
    parts_.update.reduce(bk);
    if (timeline_) {
      launched_.resize(buckets_.size());
      launched_[b] = clock::now();
      timeline_->record("bucket " + std::to_string(b) + " pack, launch", timeline_track::step, steps_, began, launched_[b]);
    }
  }

  void end_micro_batch() {
    if (tape_depth_ != 0) {
      const auto n = tape_depth_;
      tape_depth_ = 0;
      throw error("trainer", "step", comm_.rank(),
                  std::to_string(n) + " forward(s) in this step had no backward; call "
                  "replica.backward once per forward, innermost first");
    }
    if (!final_) return;
    if (!reports) std::fill(used_.begin(), used_.end(), 1);
    if (capturing_) return finish_captured_step();
    reduce_remaining();
    measure_overlap();
    read_control();
    finish_update();
  }

  // A captured step reads nothing on the host, so the control floats neither go nor come back:
  // each replay is this one micro-batch on every rank (the mean is 1), and every parameter must
  // get a gradient in it, as every replay then updates every one.
  void finish_captured_step() {
    if (micro_batches_ != 1)
      throw error("trainer", "capture", comm_.rank(),
                  "the captured step ran " + std::to_string(micro_batches_) +
                      " micro-batches; a captured step is one forward-backward pair and its update");
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!used_[i])
        throw error("trainer", "capture", comm_.rank(),
                    "parameter '" + params_[i].name + "' got no gradient in the captured step, but every replay "
                    "updates every parameter: capture a step that uses them all, or run such steps uncaptured");
    reduce_remaining();
    std::fill(update_.begin(), update_.end(), 1);
    mean_micro_batches_ = 1.0f;
    finish_update();
  }

  // One step with nothing of this rank's own (its step state is clear: end_step reset it); false,
  // and no update, when no rank was active.
  bool shadow_step() {
    return guarded("join", [&] {
      detail::timeline_span span(timeline_, "shadow step (join)", steps_);
      shadowing_ = true;
      parts_.buffer_sync.before_forward(sync_context_);  // as the active ranks' first forward
      final_ = true;
      reduce_remaining();
      read_control();
      const bool active = mean_micro_batches_ > 0.0f;
      if (active) finish_update();
      else end_step();
      shadowing_ = false;
      return active;
    });
  }

  // Launches the buckets backward has not, then waits for every bucket's reduction.
  void reduce_remaining() {
    for (std::size_t b = next_launch_; b < buckets_.size(); ++b) launch(b);
    next_launch_ = buckets_.size();
    {
      detail::timeline_span span(timeline_, "wait for reductions", steps_);
      for (auto& bk : buckets_) bk.complete_reduction();
    }
    if (timeline_) record_reductions();
  }

  // Each bucket's reduction on the collectives track: when it ran, from a work handle that
  // knows (the progress thread's), else from its launch to when the step saw it done.
  void record_reductions() {
    const auto seen = clock::now();
    launched_.resize(buckets_.size(), seen);  // a timeline attached in the middle of this step
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      auto begin = launched_[b], end = seen;
      std::string name = "bucket " + std::to_string(b) + " " + std::string(parts_.update.name()) + " reduction";
      if (parts_.comm_hook.name() != comm_hook::none::name) name += " (" + std::string(parts_.comm_hook.name()) + ")";
      if constexpr (timed_work_handle<typename bucket::work_type>) {
        if (!buckets_[b].work) continue;  // a hook that kept this bucket's gradients local
        begin = buckets_[b].work->started(), end = buckets_[b].work->finished();
      } else {
        name += " (launch to wait)";
      }
      timeline_->record(std::move(name), timeline_track::collectives, steps_, begin, end);
    }
  }

  void measure_overlap() {
    overlap_ = {};
    if constexpr (timed_work_handle<typename bucket::work_type>) {
      overlap_.measured = true;
      for (auto& bk : buckets_) {
        if (!bk.work) continue;
        const auto start = bk.work->started(), finish = bk.work->finished();
        overlap_.reduction_seconds += std::chrono::duration<double>(finish - start).count();
        const auto cut = std::min(finish, backward_done_);
        if (cut > start) overlap_.overlapped_seconds += std::chrono::duration<double>(cut - start).count();
      }
    }
  }

  // The averaged control floats are equal on every rank, so every rank decides alike: the mean
  // micro-batch count divides the averaged gradients (ranks may run different numbers of
  // micro-batches: the result is one process over all of them), and the unused-parameter policy
  // rules on what was used.
  void read_control() {
    auto& last = buckets_.back();
    std::vector<float> control(last.control);
    device_.copy_to_host(control.data(), last.grads.data() + last.padded, control.size() * sizeof(float));
    last.rethrow_failures();
    mean_micro_batches_ = control[0];
    if constexpr (reports)
      if (mean_micro_batches_ > 0.0f)  // else every rank shadowed: no step to rule on
        parts_.unused_params.after_reduction(unused_view_, std::span<const float>(control).subspan(1), update_);
  }

  void finish_update() {
    detail::timeline_span span(timeline_, "update", steps_);
    const float inv_micro = 1.0f / mean_micro_batches_;
    if (mean_micro_batches_ != 1.0f)
      for (auto& bk : buckets_) device_.scale(bk.grads.data() + bk.shard_begin, bk.shard, inv_micro);
    if (max_gradient_norm_ > 0.0f) clip_gradients();
    for (auto& bk : buckets_) {
      if (parts_.optimizer.applies_update()) {
        apply_optimizer(bk);
        zero_gradients(bk);
      } else {  // the caller's optimizer steps, and zeroes, from the averaged gradients
        if constexpr (!binds) device_.unpack(bk.segments, bk.grads.data());
      }
      parts_.update.after_update(bk);
    }
    {
      detail::timeline_span gather(parts_.update.gathers_parameters() ? timeline_ : nullptr, "gather parameters", steps_);
      for (auto& bk : buckets_) parts_.update.finish(bk);
    }
    round_masters_into_module();
    end_step();
    ++steps_;
  }

  void end_step() {
    for (auto& bk : buckets_) bk.clear_works();
    next_launch_ = 0;
    micro_batches_ = 0;
    forwards_ = 0;
    std::fill(used_.begin(), used_.end(), 0);
  }

  // Updates this rank's shard of the bucket (all of it when replicated); segment offsets, and
  // the gradient and state pointers, count from the shard's start. Parameters with the same
  // update count share one call (AdamW's bias correction counts per parameter, as PyTorch).
  // One update call per run of segments with the same step count and parameter group.
  void apply_optimizer(bucket& bk) {
    std::vector<segment> segs;
    std::vector<std::int64_t> counts;
    std::vector<std::size_t> groups;
    for (const auto i : bk.params) {
      if (!update_[i]) continue;
      const auto count = ++update_counts_[i];
      const auto& p = params_[i];
      const segment part = bk.shard_part({p.value, p.slot.offset, p.numel});
      if (part.count == 0) continue;
      segs.push_back(part);
      counts.push_back(count);
      groups.push_back(group_of_.empty() ? 0 : group_of_[i]);
    }
    const float* grad = bk.grads.data() + bk.shard_begin;
    for (std::size_t begin = 0, end; begin < segs.size(); begin = end) {
      for (end = begin + 1; end < segs.size() && counts[end] == counts[begin] && groups[end] == groups[begin];) ++end;
      parts_.optimizer.update(device_, std::span(segs).subspan(begin, end - begin), grad, bk.state.data(), bk.shard,
                              counts[begin], groups[begin] ? &groups_[groups[begin] - 1] : nullptr);
    }
  }

  // The norm of the whole averaged gradient: where the update policy's layout gives each rank a
  // disjoint shard of a bucket (update::sharded), the shards' sums of squares are summed over the
  // ranks (one small all-reduce); the layouts are alike on every rank, so all decide alike.
  void clip_gradients() {
    double sum = 0.0;
    bool sharded = false;
    for (auto& bk : buckets_) {
      sum += device_.sum_of_squares(bk.grads.data() + bk.shard_begin, bk.shard);
      sharded = sharded || bk.shard < bk.padded;
    }
    if (sharded) detail::host_all_reduce(comm_, device_, std::span<double>(&sum, 1), reduce_op::sum);
    gradient_norm_ = std::sqrt(sum);
    const double coefficient = static_cast<double>(max_gradient_norm_) / (gradient_norm_ + 1e-6);  // as PyTorch's
    if (coefficient >= 1.0) return;
    for (auto& bk : buckets_)
      device_.scale(bk.grads.data() + bk.shard_begin, bk.shard, static_cast<float>(coefficient));
  }

  void zero_gradients(bucket& bk) {
    if constexpr (binds)
      device_.fill_zero(bk.grads.data(), bk.numel * sizeof(float));
    else
      for (const auto& s : bk.segments) device_.fill_zero(s.tensor, s.count * sizeof(float));
    for (const auto& h : bk.half_grads) device_.fill_zero(h.tensor, h.count * size_of(h.type));
  }

  Module& module_;
  Comm& comm_;
  Device& device_;
  parts_type parts_;

  std::vector<parameter_ref> param_refs_;
  std::vector<buffer_ref> buffer_refs_;
  std::vector<param_info> params_;
  detail::buffer_set<Comm, Device> buffers_;
  device_array<Device, float> masters_;  // the f32 master copies of 16-bit parameters
  std::vector<bucket> buckets_;
  detail::storage_return<Module> storage_return_;  // after buckets_: destroyed first

  // Per step.
  int tape_depth_ = 0;
  bool final_ = false;
  bool sent_ = false;  // the step's last backward has begun: buckets go out as they fill
  float max_gradient_norm_ = 0.0f;  // 0: no clipping
  double gradient_norm_ = 0.0;
  bool active_ = false;
  std::size_t next_launch_ = 0;
  std::size_t micro_batches_ = 0;
  float mean_micro_batches_ = 1.0f;  // over the ranks, from the last bucket's control floats
  bool shadowing_ = false;           // in join(): this step is the peers', not this rank's
  bool capturing_ = false;           // this step is being captured into a CUDA graph
  std::size_t forwards_ = 0;    // since the last update
  std::vector<char> used_;      // reported in any backward of this step
  std::vector<char> reported_;  // reported in the final backward
  clock::time_point backward_done_{};

  // Across steps.
  std::vector<char> update_;  // the optimizer updates parameter i (the unused-parameter rule's say)
  std::vector<std::int64_t> update_counts_;
  std::vector<optim::parameter_group> groups_;  // set_parameter_group's, in order
  std::vector<std::size_t> group_of_;            // per parameter: 0, or 1 + its index in groups_
  std::uint64_t steps_ = 0;
  std::uint64_t micro_batches_run_ = 0;
  overlap_timing overlap_;
  std::optional<std::string> broken_;
  timeline* timeline_ = nullptr;                // attached by record_timeline
  std::vector<clock::time_point> launched_;     // per bucket, while a timeline records

  sync_context sync_context_{*this};
  unused_view unused_view_{*this};
};

}  // namespace ddp
