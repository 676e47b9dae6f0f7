#pragma once
// The gradient reducer: owns the buckets and everything about a step's reduction.
//
//   ready tracking   which parameters the module reported in this step (any backward) and in the
//                    final one; a bucket whose parameters are all ready launches
//   launch order     buckets go strictly in index order, so every rank issues the same
//                    collectives in the same order whatever order its backward finishes in
//   control channel  the last bucket carries this rank's micro-batch count and the
//                    unused-parameter policy's floats, averaged with the gradients; when the
//                    update overlaps the reductions (and there are buckets to update while the
//                    last reduces), they go in a collective of their own, issued just before the
//                    last bucket's gradients, so that the step's verdict is known while that
//                    bucket still reduces
//   completion       every bucket's reduction completes in bucket order: all of them at the end
//                    of the step's backward, or, when the update overlaps, each one as the update
//                    stage comes to it (complete_through)
//   the hook's state kept per bucket, saved in checkpoints with the bucket layout
//   gradient memory  under an update policy that keeps only its shard of the gradients, a bucket
//                    holds its full gradients from the backward of its first layer (the module's
//                    layer hooks) until its reduction completed, and the module's gradients are
//                    placed there meanwhile; once a bucket launched, the oldest beyond the
//                    policy's bound complete, at the same point on every rank. The memory comes
//                    from a pool of arrays kept across steps, each given to a bucket it fits (the
//                    smallest that does), made at the bucket's own size when none does: the pool
//                    settles in the first steps, after which a step allocates nothing, and a
//                    large layer does not make every array large
//   parameter memory under an update policy that keeps only its shard of the parameters, a bucket
//                    holds its gathered parameters from the forward (or backward) of its first
//                    layer until every layer of it is through, from the same pool; the module's
//                    values are placed there meanwhile, and the bucket the pass needs next starts
//                    gathering while a layer computes. gather_parameters() holds them all (in
//                    memory of their own), for what reads the whole model between steps (an
//                    evaluation, a checkpoint)
//
// It is built from the bucket policy's plan and the update policy's layout, both checked here:
// a plan that leaves a parameter out, puts two in one place or runs past its bucket, and a
// layout that does not cut the bucket as its all_gather will, are errors naming the parameter or
// the bucket and the policy.
#include <algorithm>
#include <cmath>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ddp/comm/host_collectives.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/layer_hooks.hpp"
#include "ddp/policy/bucket_cap.hpp"
#include "ddp/policy/unused_params.hpp"
#include "ddp/trainer/bucket.hpp"
#include "ddp/trainer/checkpoint_file.hpp"
#include "ddp/trainer/consensus.hpp"
#include "ddp/trainer/memory_held.hpp"
#include "ddp/trainer/parameter_table.hpp"
#include "ddp/trainer/parts.hpp"
#include "ddp/trainer/step_observer.hpp"

namespace ddp::detail {

// A bucket's row in a checkpoint's layout: numel, padded, shard begin, shard.
using saved_bucket = std::array<std::size_t, 4>;
inline std::vector<saved_bucket> saved_bucket_layout(const checkpoint_file& f) { return number_rows<4>(f.text("buckets")); }

// It is the module's layer hooks too (update::sharded_gradients, update::fully_sharded): they hold
// and release memory.
template <communicator Comm, device Device>
class gradient_reducer final : public layer_hooks {
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
    bool reports = false;          // the module reports ready gradients
    bool binds_gradients = false;  // it keeps its gradients in bucket memory
    bool binds_values = false;     // it keeps its parameters in the gathered copy
  };

  // Places every parameter of `params` in its bucket (its grad, and value when bound, now point
  // into bucket memory).
  gradient_reducer(Comm& comm, Device& dev, parameter_table& params, const bucket_plan& plan, wiring w)
      : comm_(comm), device_(dev), params_(params), w_(w) {
    // Checked on every rank before any bucket is made; a fault on one rank is an error on all.
    std::optional<std::string> problem = plan_problem(plan);
    std::vector<bucket_shape> shapes;
    for (std::size_t b = 0; !problem && b < plan.buckets.size(); ++b) {
      bucket_shape shape{b, plan.sizes[b], w.update.plan(plan.sizes[b], comm.rank(), comm.size())};
      if (b + 1 == plan.buckets.size()) shape.control = 1 + (w.reports ? w.unused_params.control_floats(params.size()) : 0);
      shape.gathers = w.update.gathers_parameters();
      shape.binds_values = w.binds_values;
      shape.releases_gradients = w.update.gradient_buckets_in_flight() > 0;
      shape.shards_parameters = w.update.shards_parameters();
      shape.binds_gradients = w.binds_gradients || shape.releases_gradients;  // placed, layer by layer
      shape.virtual_shards = w.reduction.virtual_shards();
      problem = layout_problem(shape);
      if (!problem && shape.virtual_shards && static_cast<std::size_t>(comm.size()) > shape.virtual_shards)
        problem = "a world of " + std::to_string(comm.size()) + " ranks cannot hold " +
                  std::to_string(shape.virtual_shards) + " virtual shards, one at least per rank: run at most " +
                  std::to_string(shape.virtual_shards) + " ranks, or choose more shards (reduction::invariant<V>)";
      if (!problem && shape.shards_parameters && !w.binds_values)
        problem = "update::" + std::string(w.update.name()) + " keeps only this rank's shard of the parameters, so "
                  "the module's values must live in the trainer's memory, which holds f32 parameters only; this "
                  "module has " + std::to_string(params.half_floats()) + " 16-bit parameter value(s): keep the "
                  "parameters in f32, or use update::sharded_gradients";
      if (!problem && shape.shards_parameters && shape.virtual_shards % static_cast<std::size_t>(comm.size()) != 0)
        problem = "update::" + std::string(w.update.name()) + " gathers the parameters in every micro-batch's forward "
                  "and backward, so every rank must run as many micro-batches per step; under reduction::invariant<" +
                  std::to_string(shape.virtual_shards) + "> the " + std::to_string(comm.size()) + " ranks would run " +
                  "uneven shares of the virtual shards: run on a world size that divides " +
                  std::to_string(shape.virtual_shards) + ", or use update::sharded_gradients";
      shapes.push_back(shape);
    }
    agree_or_throw(comm, dev, problem, "construct", "the bucket plan or the update layout cannot be used");
    buckets_.reserve(shapes.size());
    for (const auto& shape : shapes) buckets_.emplace_back(comm, dev, w.hook, w.steps, shape, plan.buckets[shape.index]);
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto& p = params[i];
      p.slot = plan.slots[i];
      auto& bk = buckets_[p.slot.bucket];
      if (p.type == dtype::f32) {
        float* in_bucket = bk.add_gradient(p.grad, p.slot.offset, p.numel);
        if (w.binds_gradients || bk.releases_gradients()) p.grad = in_bucket;  // nullptr until held
      } else {
        bk.add_half_gradient(p.module_grad, p.type, p.slot.offset, p.numel);
      }
      p.value = bk.add_value(p.value, p.slot.offset, p.numel, p.rows);
    }
    used_.assign(params.size(), 0);
    reported_.assign(params.size(), 0);
    forwarded_.assign(params.size(), 0);
    backwarded_.assign(params.size(), 0);
  }
  gradient_reducer(const gradient_reducer&) = delete;
  gradient_reducer& operator=(const gradient_reducer&) = delete;
  ~gradient_reducer() { drain(); }
  // Waits for the collectives still in flight (a step that failed half-way), ignoring failures:
  // before bucket memory goes, or the module takes its storage back.
  void drain() noexcept {
    for (auto& bk : buckets_) bk.drain();
    if (control_work_) try {
        control_work_->wait();
      } catch (...) {
      }
  }

  std::span<bucket_type> buckets() noexcept { return buckets_; }
  std::span<const bucket_type> buckets() const noexcept { return buckets_; }
  std::vector<std::size_t> bucket_sizes() const {
    std::vector<std::size_t> sizes;
    for (const auto& bk : buckets_) sizes.push_back(bk.numel());
    return sizes;
  }

  // ---- a step --------------------------------------------------------------------------------

  // ---- gradient memory held only while needed (update::sharded_gradients) -------------------

  bool releases_gradients() const noexcept { return w_.update.gradient_buckets_in_flight() > 0; }
  // The buckets' gradients and gathered parameters, and what the module keeps itself: values not
  // bound into the gathered copy, gradients neither bound nor placed (trainer/memory_held.hpp).
  memory_held memory() const noexcept {
    memory_held m;
    for (const auto& bk : buckets_) m.gradients += bk.gradient_bytes(), m.parameters += bk.parameter_bytes();
    for (const auto& a : spare_) m.gradients += a.size() * sizeof(float);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto& p = params_[i];
      const std::size_t bytes = p.numel * size_of(p.type);
      if (!w_.binds_values || p.type != dtype::f32) m.parameters += bytes;
      if (p.type != dtype::f32 || !(w_.binds_gradients || releases_gradients())) m.gradients += bytes;
    }
    return m;
  }
  // How the module's gradient of parameter i is pointed at memory (nullptr: nowhere); set by the
  // component that knows the module (trainer/storage_return.hpp), empty to stop.
  void set_gradient_placement(std::function<void(std::size_t, float*)> place) { place_ = std::move(place); }
  // The module's layer hook: backward is about to read parameters [first, first + count) and
  // write their gradients.
  void before_backward(std::size_t first, std::size_t count) override {
    if (shards_parameters()) need_values(first, count, /*forward=*/false);
    for (std::size_t i = first; i < first + count && i < params_.size(); ++i)
      if (params_[i].type == dtype::f32) hold(buckets_[params_[i].slot.bucket], i);
  }

  // ---- parameter memory held only while needed (update::fully_sharded) ----------------------

  bool shards_parameters() const noexcept { return w_.update.shards_parameters(); }
  // How the module's value of parameter i is pointed at memory (nullptr: nowhere); empty to stop.
  void set_parameter_placement(std::function<void(std::size_t, float*)> place) { place_values_ = std::move(place); }
  // The module's layer hooks around a layer's forward, and after its backward.
  void before_forward(std::size_t first, std::size_t count) override {
    if (shards_parameters()) need_values(first, count, /*forward=*/true);
  }
  void after_forward(std::size_t first, std::size_t count) override {
    if (shards_parameters()) done_with_values(first, count, forwarded_);
  }
  void after_backward(std::size_t first, std::size_t count) override {
    if (shards_parameters()) done_with_values(first, count, backwarded_);
  }
  // Every parameter gathered into the module and kept there (the layer hooks neither release nor
  // gather any) until the next micro-batch begins or release_parameters(). Collective. Returns
  // whether it gathered them (false: they were already, or the policy keeps them whole).
  bool gather_parameters() {
    if (!shards_parameters() || pinned_) return false;
    for (auto& bk : buckets_)
      if (!bk.values_held()) hold_values(bk, /*gather=*/true, /*pooled=*/false);
    for (auto& bk : buckets_) bk.wait_values();
    pinned_ = true;
    return true;
  }
  // Gives back gather_parameters()'s memory; none of it is kept for the next step (it held the
  // whole model, in memory of its own: the pool the steps use is left as it was). Not collective.
  void release_parameters() {
    if (!pinned_) return;
    pinned_ = false;
    for (auto& bk : buckets_)
      if (bk.values_held()) release_values(bk, /*to_pool=*/false);
  }
  // The trainer goes: under a policy that keeps only shards of the parameters, a module whose
  // parameters were not gathered gets zeros back, which rank 0 says (a destructor cannot gather).
  void warn_unless_gathered() const {
    if (shards_parameters() && !pinned_ && comm_.rank() == 0)
      std::fprintf(stderr,
                   "ddp: the trainer (update::%s) went without trainer.gather_parameters(), so the module gets its "
                   "parameters back as zeros; call gather_parameters() on every rank before the trainer goes to keep "
                   "the trained values, or load them from a checkpoint\n",
                   std::string(w_.update.name()).c_str());
  }
  // Memory for every parameter, not gathered: a checkpoint's values are written there next, and
  // stage_values() keeps this rank's shard of them.
  void hold_parameters() {
    if (!shards_parameters()) return;
    for (auto& bk : buckets_)
      if (!bk.values_held()) hold_values(bk, /*gather=*/false, /*pooled=*/false);
    pinned_ = true;
  }
  // Before the parameters are written to a checkpoint: they must be gathered.
  void require_parameters_gathered() const {
    if (shards_parameters() && !pinned_)
      throw error("trainer", "state", comm_.rank(),
                  "update::" + std::string(w_.update.name()) + " keeps only this rank's shard of the parameters, "
                  "and they were not gathered for this state: trainer.save() gathers them, on every rank; a rank "
                  "whose world failed cannot, so resume from the last checkpoint");
  }

  // A micro-batch begins: parameters gathered between steps go (the layer hooks hold them again).
  void begin_micro_batch() {
    release_parameters();
    ++micro_batches_;
  }
  // A micro-batch before the step's last ended. Under an exact sum its gradients are set aside and
  // the next starts from zero; otherwise they accumulate in place.
  void end_accumulated_micro_batch() {
    if (!w_.reduction.virtual_shards()) return;
    for (auto& bk : buckets_)
      if (bk.releases_gradients()) hold(bk, bk.parameters().empty() ? 0 : bk.parameters().front());
    for (auto& bk : buckets_) bk.set_aside_micro_batch();
    for (auto& bk : buckets_) bk.zero_gradients();
  }
  // Micro-batches since the last update (this one included, from its start).
  std::size_t micro_batches() const noexcept { return micro_batches_; }
  // Inside join(): the step is the peers', this rank has nothing of its own to report.
  void set_shadowing(bool on) noexcept { shadowing_ = on; }
  // Inside a captured step: nothing goes to or comes from the host (no control floats).
  void set_capturing(bool on) noexcept { capturing_ = on; }
  bool capturing() const noexcept { return capturing_; }

  // A backward begins; in the step's final one, buckets launch as their parameters report ready.
  void begin_backward(bool final) {
    backward_ran_ = true;
    collecting_ = final;
    if (!final) return;
    for (auto& bk : buckets_) bk.expect(bk.parameters().size());
    std::fill(reported_.begin(), reported_.end(), 0);
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!w_.unused_params.expects_gradient(i)) unexpected(i);
    if (w_.reports) launch_ready();
  }
  void end_backward() noexcept { collecting_ = false; }

  // The module's ready sink: parameter i's gradient is final for this backward.
  void on_ready(std::size_t i) {
    if (i >= params_.size())
      throw error("trainer", "backward", comm_.rank(),
                  "the module reported parameter index " + std::to_string(i) + " ready, but it has " +
                      std::to_string(params_.size()) + " parameters");
    used_[i] = 1;
    if (!collecting_) return;
    if (reported_[i])
      throw error("trainer", "backward", comm_.rank(),
                  "parameter '" + params_.name(i) + "' was reported ready twice in one backward; "
                  "report each parameter once, when its gradient is final");
    reported_[i] = 1;
    if (!w_.unused_params.expects_gradient(i)) return w_.unused_params.on_unexpected_gradient(view_, i);
    if (buckets_[params_[i].slot.bucket].ready_one()) launch_ready();
  }

  // A module that cannot report counts every parameter as used.
  void mark_all_used() { std::fill(used_.begin(), used_.end(), 1); }

  // Launches the buckets backward has not, then waits for every bucket's reduction; when the
  // update overlaps them, it waits for none (complete_through, bucket by bucket).
  void reduce_all() {
    // A rank whose step function ran no backward (no data of its own) contributes zeros, as before.
    if (w_.reports && backward_ran_ && !shadowing_ && params_.size() != 0 &&
        std::find(used_.begin(), used_.end(), 1) == used_.end())
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
  void complete_through(std::size_t b) {
    if (next_complete_ > b) return;
    {
      auto span = w_.observer.phase("wait for reductions", w_.steps);
      for (; next_complete_ <= b; ++next_complete_) complete(buckets_[next_complete_]);
    }
    if (next_complete_ < buckets_.size()) return;
    w_.observer.record_reductions(buckets_, w_.steps, w_.update.name(), w_.hook.name());
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
  void confirm_collectives() {
    using work_type = typename bucket_type::work_type;
    if constexpr (stream_ordered_work<work_type>) {
      if (capturing_) return;  // a captured step reads nothing back (and a capture cannot wait)
      device_.synchronize();
      for (const auto& bk : buckets_) bk.rethrow_failures();
    }
  }

  // For what runs between steps only: join() (their gradients would go in with nothing to count
  // them) and zero_gradients() (it would discard them).
  void require_no_micro_batches(const char* operation) const {
    if (micro_batches_ != 0)
      throw error("trainer", operation, comm_.rank(),
                  std::to_string(micro_batches_) + " accumulate() micro-batch(es) have no step(); finish them with "
                  "step() before " + operation + "(), between steps");
  }
  // join(): between steps; and a joined rank shadows the others' steps, but under an exact sum a
  // step is the V virtual shards, whatever the ranks hold.
  void require_joinable() const {
    if (shards_parameters())  // every rank alike: nobody waits
      throw collective_error("trainer", "join", comm_.rank(),
                  "update::" + std::string(w_.update.name()) + " gathers each layer's parameters in forward and "
                  "backward, collectives that a joined rank, which runs neither, cannot mirror: give every rank as "
                  "many batches (trainer.epoch_shards(loader), or a sampler that drops the last uneven ones) and "
                  "leave join() out, or use update::sharded_gradients");
    if (const std::size_t v = w_.reduction.virtual_shards())
      throw error("trainer", "join", comm_.rank(),
                  "under reduction::invariant<" + std::to_string(v) + "> every step is its " + std::to_string(v) +
                      " virtual shards, so no rank runs out of batches before the others: deal the data with "
                      "trainer.epoch_shards(loader), whose shards have as many batches each (repeats weighing "
                      "nothing), and leave join() out");
    require_no_micro_batches("join");
  }

  // A captured step reads nothing on the host, so the control floats neither go nor come back:
  // each replay is this one micro-batch on every rank (the mean is 1), and every parameter must
  // get a gradient in it, as every replay then updates every one.
  void reduce_captured_step() {
    if (micro_batches_ != 1)
      throw error("trainer", "capture", comm_.rank(),
                  "the captured step ran " + std::to_string(micro_batches_) +
                      " micro-batches; a captured step is one forward-backward pair and its update");
    if (const auto it = std::find(used_.begin(), used_.end(), 0); it != used_.end())
      throw error("trainer", "capture", comm_.rank(),
                  "parameter '" + params_.name(it - used_.begin()) + "' got no gradient in the captured step, but "
                  "every replay updates every parameter: capture a step that uses them all, or run such steps "
                  "uncaptured");
    reduce_all();
  }

  // The averaged control floats are equal on every rank, so every rank decides alike: returns
  // the mean micro-batch count over the ranks (0: every rank shadowed), and lets the
  // unused-parameter policy rule on what was used (into `update`: the optimizer updates
  // parameter i).
  // Under an exact sum the gradients already are the average over the step's V micro-batches:
  // it returns 1 (or 0), after checking that the ranks ran V in all.
  float read_control(std::span<char> update) {
    auto& last = buckets_.back();
    std::vector<float> control(last.control_floats());
    if (control_work_) {  // sent on their own (overlap_update)
      control_work_->wait();
      device_.copy_to_host(control.data(), control_.data(), control.size() * sizeof(float));
      rethrow_failure(*control_work_);
    } else {
      complete_through(buckets_.size() - 1);  // done already, unless the update overlaps one bucket
      last.read_control(control);
    }
    if (w_.reports && control[0] > 0.0f) try {
        w_.unused_params.after_reduction(view_, std::span<const float>(control).subspan(1), update);
      } catch (...) {
        drain();  // overlapped: the buckets still reducing write into gradients the module holds
        throw;
      }
    const std::size_t shards = w_.reduction.virtual_shards();
    if (!shards || control[0] == 0.0f) return control[0];
    const auto total = static_cast<std::size_t>(std::lround(control[0] * static_cast<float>(comm_.size())));
    if (total != shards)
      throw collective_error("trainer", "step", comm_.rank(),
                             "under reduction::invariant<" + std::to_string(shards) + "> a step is " +
                                 std::to_string(shards) + " micro-batches over all ranks (one per virtual shard), "
                                 "but the ranks ran " + std::to_string(total) + " in this one: deal the shards with "
                                 "ddp::sampler::virtual_shards and run each once, with accumulate() and a last step()");
    return 1.0f;
  }

  void end_step() {
    if (next_complete_ < next_launch_) complete_through(next_launch_ - 1);  // a step no rank was active in
    for (auto& bk : buckets_) bk.clear_works();
    control_work_.reset();
    next_launch_ = 0;
    next_complete_ = 0;
    micro_batches_ = 0;
    std::fill(used_.begin(), used_.end(), 0);
    backward_ran_ = false;
    // The update changed the kept shards: gathered copies still held (a layer that skipped its
    // backward) are stale.
    if (shards_parameters())
      for (auto& bk : buckets_)
        if (bk.values_held()) release_values(bk, /*to_pool=*/true);
  }

  void zero_gradients() {
    for (auto& bk : buckets_) bk.zero_gradients();
  }

  // Parameters the module keeps itself, under an update policy that gathers: the gathered copy
  // takes their values. Under one that keeps only its shard of them, this rank's shard is kept from
  // the gathered copy, which goes (the module's values are placed nowhere).
  void stage_values() {
    if (shards_parameters()) {
      for (auto& bk : buckets_)
        if (bk.values_held()) {
          bk.wait_values();
          bk.keep_value_shard();
          release_values(bk, /*to_pool=*/false);
        }
      pinned_ = false;
      return;
    }
    if (w_.update.gathers_parameters() && !w_.binds_values)
      for (auto& bk : buckets_) bk.stage_values();
  }

  std::optional<std::string> capture_refusal() const {
    if (micro_batches_ != 0) return "accumulate() micro-batches are waiting for their step(); capture between steps";
    if (releases_gradients())
      return "update::" + std::string(w_.update.name()) + " allocates and frees the buckets' gradients in every "
             "step, which a captured step cannot; use update::sharded to capture";
    if (w_.reduction.virtual_shards())
      return "reduction::invariant sums each step's micro-batches on the host, which a captured step cannot; "
             "run it uncaptured";
    if (!w_.hook.capturable())
      return "the communication hook '" + std::string(w_.hook.name()) +
             "' keeps host-side state per step; capture with comm_hook::none, fp16 or bf16";
    return std::nullopt;
  }

  // ---- checkpoint sections: "buckets" (the layout) and the hook's state ---------------------

  void write_state(checkpoint_file& f) const {
    std::string layout, hook_index;
    for (const auto& bk : buckets_)
      layout += std::to_string(bk.numel()) + " " + std::to_string(bk.padded()) + " " +
                std::to_string(bk.shard_begin()) + " " + std::to_string(bk.shard()) + "\n";
    f.set_text("buckets", layout);
    // "bucket slot floats" per line.
    for (const auto& bk : buckets_)
      for (std::size_t k = 0; k < bk.hook_state().size(); ++k) {
        const auto& a = bk.hook_state()[k];
        if (a.size() == 0) continue;
        std::vector<float> v(a.size());
        device_.copy_to_host(v.data(), a.data(), v.size() * sizeof(float));
        f.set_array(hook_state_name(bk.index(), k), std::span<const float>(v));
        hook_index += std::to_string(bk.index()) + " " + std::to_string(k) + " " + std::to_string(v.size()) + "\n";
      }
    if (!hook_index.empty()) f.set_text("hook_state", hook_index);
  }

  // The bucket layout (checked first) and the hook's state (checked last).
  std::optional<std::string> check_buckets(const checkpoint_file& f) const {
    std::string sizes, theirs;
    for (const auto& bk : buckets_) sizes += std::to_string(bk.numel()) + " ";
    for (const auto& row : saved_bucket_layout(f)) theirs += std::to_string(row[0]) + " ";
    if (sizes != theirs)
      return "'" + f.path() + "' was written with buckets of " + theirs + "elements, this trainer has " + sizes +
             "(another bucket_cap): build the trainer with the checkpoint's bucket_cap";
    return std::nullopt;
  }
  std::optional<std::string> check_hook_state(const checkpoint_file& f) const {
    for (const auto& [bucket, slot, floats] : hook_state_index(f)) {
      if (bucket >= buckets_.size() || slot > 64)
        return "'" + f.path() + "' holds communication-hook state for bucket " + std::to_string(bucket) + " slot " +
               std::to_string(slot) + ", which this trainer does not have";
      const auto name = hook_state_name(bucket, slot);
      if (!f.has(name) || f.section(name).size() % sizeof(float) || f.section(name).size() / sizeof(float) != floats)
        return "'" + f.path() + "': its communication-hook state '" + name +
               "' is missing or of another size than its index says";
    }
    return std::nullopt;
  }

  // The hook's state is this rank's own (error feedback): restored at the same world size (one
  // file), and started afresh at another.
  void read_state(const std::vector<checkpoint_file>& files) {
    for (auto& bk : buckets_) bk.hook_state().clear();
    if (files.size() != 1) return;
    for (const auto& [bucket, slot, floats] : hook_state_index(files[0])) {
      auto& arrays = buckets_[bucket].hook_state();
      if (arrays.size() <= slot) arrays.resize(slot + 1);
      arrays[slot] = device_array<Device, float>(device_, floats);
      const auto v = files[0].array<float>(hook_state_name(bucket, slot), floats);
      device_.copy_from_host(arrays[slot].data(), v.data(), floats * sizeof(float));
    }
  }

 private:
  static std::string hook_state_name(std::size_t bucket, std::size_t slot) {
    return "hook_state/" + std::to_string(bucket) + "/" + std::to_string(slot);
  }
  // A checkpoint's communication-hook state: bucket, slot, floats of each (none when no hook kept state).
  static std::vector<std::array<std::size_t, 3>> hook_state_index(const checkpoint_file& f) {
    if (!f.has("meta/hook_state")) return {};
    return number_rows<3>(f.text("hook_state"));
  }

  // A parameter the unused-parameter policy expects no gradient for is not waited for.
  void unexpected(std::size_t i) { buckets_[params_[i].slot.bucket].ready_one(); }

  void launch_ready() {
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].ready()) launch(next_launch_++);
  }

  // Memory for the bucket's full gradients, for parameter `i`'s backward (or its launch).
  void hold(bucket_type& bk, std::size_t i) {
    if (bk.held()) return;
    if (bk.completed())
      throw error("trainer", "backward", comm_.rank(),
                  "parameter '" + params_.name(i) + "' is about to get a gradient after its bucket's reduction "
                  "completed in this step (update::" + std::string(w_.update.name()) + " keeps only this rank's "
                  "shard from then on): the unused-parameter policy expected no gradient for a parameter of "
                  "bucket " + std::to_string(bk.index()) + "; use unused_params::detect_each_step, or keep the "
                  "parameter out of backward");
    bk.hold_gradients(spare_for(bk.held_floats()));
    if (place_)
      for (const auto p : bk.parameters())
        if (params_[p].type == dtype::f32) place_(p, bk.gradient_memory() + params_[p].slot.offset);
  }
  // The smallest spare array that holds `floats`; else a new one of that size, which replaces the
  // largest spare (too small) so that the pool never holds more arrays than were in use at once.
  // Arrays are only replaced by larger ones and added, so the pool settles in the first steps.
  device_array<Device, float> spare_for(std::size_t floats) {
    if (spare_.empty()) return device_array<Device, float>(device_, floats);
    auto best = spare_.end(), largest = spare_.begin();
    for (auto it = spare_.begin(); it != spare_.end(); ++it) {
      if (it->size() >= floats && (best == spare_.end() || it->size() < best->size())) best = it;
      if (it->size() > largest->size()) largest = it;
    }
    if (best == spare_.end()) {
      spare_.erase(largest);  // freed before the new one is made: the high-water mark is the pool's
      return device_array<Device, float>(device_, floats);
    }
    auto memory = std::move(*best);
    spare_.erase(best);
    return memory;
  }

  // Parameters [first, first + count) are about to be read: their buckets' values gathered (and
  // waited for), and the bucket that the pass needs next starts gathering: that of the parameter
  // just past these buckets' own (after them in forward, before them in backward; a bucket's
  // parameters lie together).
  void need_values(std::size_t first, std::size_t count, bool forward) {
    const std::size_t last = std::min(first + count, params_.size());
    std::size_t lo = params_.size(), hi = 0;
    for (std::size_t i = first; i < last; ++i) {
      auto& bk = buckets_[params_[i].slot.bucket];
      if (!bk.values_held()) hold_values(bk, /*gather=*/true, /*pooled=*/true);
      for (const auto p : bk.parameters()) lo = std::min(lo, p), hi = std::max(hi, p);
    }
    const std::size_t next = forward ? hi + 1 : (lo == 0 ? params_.size() : lo - 1);
    if (first < last && next < params_.size())
      if (auto& bk = buckets_[params_[next].slot.bucket]; !bk.values_held())
        hold_values(bk, /*gather=*/true, /*pooled=*/true);
    for (std::size_t i = first; i < last; ++i) buckets_[params_[i].slot.bucket].wait_values();
  }
  // A layer's forward (or backward) is done with parameters [first, first + count): a bucket whose
  // every parameter is through gives its gathered memory back to the pool.
  void done_with_values(std::size_t first, std::size_t count, std::vector<char>& through) {
    if (pinned_) return;
    const std::size_t last = std::min(first + count, params_.size());
    for (std::size_t i = first; i < last; ++i) through[i] = 1;
    for (std::size_t i = first; i < last; ++i) {
      auto& bk = buckets_[params_[i].slot.bucket];
      const auto members = bk.parameters();
      if (bk.values_held() && std::all_of(members.begin(), members.end(), [&](std::size_t p) { return through[p] != 0; }))
        release_values(bk, /*to_pool=*/true);
    }
  }
  // Memory for the bucket's parameters (gathered into it, or to be written), from the pool or of
  // its own, the module's values placed there.
  void hold_values(bucket_type& bk, bool gather, bool pooled) {
    bk.hold_values(pooled ? spare_for(bk.padded()) : device_array<Device, float>(device_, bk.padded()), gather);
    for (const auto p : bk.parameters()) {
      params_[p].value = bk.value_memory() + params_[p].slot.offset;
      if (place_values_) place_values_(p, params_[p].value);
    }
  }
  void release_values(bucket_type& bk, bool to_pool) {
    for (const auto p : bk.parameters()) {
      params_[p].value = nullptr;
      if (place_values_) place_values_(p, nullptr);
      forwarded_[p] = backwarded_[p] = 0;
    }
    auto memory = bk.release_values();
    if (to_pool) spare_.push_back(std::move(memory));
  }
  // The bucket's reduction completes; its full gradients go back to the pool when the policy keeps
  // only the shard.
  void complete(bucket_type& bk) {
    bk.complete_reduction();
    if (!bk.releases_gradients() || !bk.held()) return;
    if (place_)
      for (const auto i : bk.parameters())
        if (params_[i].type == dtype::f32) place_(i, nullptr);
    spare_.push_back(bk.release_gradients());
  }

  void launch(std::size_t b) {
    const auto began = w_.observer.launch_begins();
    auto& bk = buckets_[b];
    if (bk.releases_gradients()) hold(bk, bk.parameters().empty() ? 0 : bk.parameters().front());  // none got one
    std::vector<float> control;
    if (bk.control_floats() && !capturing_) {  // captured: every replay is one micro-batch on every rank, nothing read
      control.assign(bk.control_floats(), 0.0f);
      control[0] = static_cast<float>(micro_batches_);
      // A shadowing rank used nothing and broke no rule: its policy floats stay 0.
      if (w_.reports && !shadowing_) w_.unused_params.write_control(view_, std::span(control).subspan(1));
    }
    // With one bucket nothing could be updated while it reduces: the control floats stay in it.
    if (overlaps_update_ && !control.empty() && buckets_.size() > 1) {
      send_control(control);
      bk.launch(w_.update, {}, /*carries_control=*/false);
    } else {
      bk.launch(w_.update, control, /*carries_control=*/true);
    }
    w_.observer.launched(b, buckets_.size(), began, w_.steps);
    // Every rank launches in bucket order, so every rank completes the oldest at the same point.
    if (const std::size_t bound = w_.update.gradient_buckets_in_flight())
      for (; next_complete_ + bound <= b; ++next_complete_) complete(buckets_[next_complete_]);
  }

  // The control floats averaged in a collective of their own, ahead of the last bucket's.
  void send_control(std::span<const float> control) {
    if (control_.size() != control.size()) control_ = device_array<Device, float>(device_, control.size());
    device_.copy_from_host(control_.data(), control.data(), control.size_bytes());
    control_work_.emplace(comm_.all_reduce(const_buffer{control_.data(), control.size(), dtype::f32},
                                           mutable_buffer{control_.data(), control.size(), dtype::f32}, reduce_op::avg));
  }

  // ---- the plan and the layout, checked --------------------------------------------------------

  std::optional<std::string> plan_problem(const bucket_plan& plan) const {
    const std::string policy = "the bucket_cap policy's plan";
    if (plan.buckets.empty() || plan.sizes.size() != plan.buckets.size())
      return (policy + " has " + std::to_string(plan.buckets.size()) + " bucket(s) and " + std::to_string(plan.sizes.size()) +
           " size(s); give every bucket a size, and at least one bucket");
    if (plan.slots.size() != params_.size())
      return (policy + " places " + std::to_string(plan.slots.size()) + " parameter(s), but the module has " +
           std::to_string(params_.size()) + "; give bucket_plan::slots one entry per parameter");
    std::vector<std::size_t> listed(params_.size(), 0);
    for (std::size_t b = 0; b < plan.buckets.size(); ++b)
      for (const auto i : plan.buckets[b]) {
        if (i >= params_.size())
          return (policy + " lists parameter index " + std::to_string(i) + " in bucket " + std::to_string(b) +
               ", but the module has " + std::to_string(params_.size()) + " parameters");
        if (plan.slots[i].bucket != b)
          return (policy + " lists parameter '" + params_.name(i) + "' in bucket " + std::to_string(b) +
               " but places it in bucket " + std::to_string(plan.slots[i].bucket) + "; list it where its slot is");
        ++listed[i];
      }
    std::vector<std::vector<std::size_t>> by_bucket(plan.buckets.size());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto& s = plan.slots[i];
      if (listed[i] != 1)
        return (policy + " lists parameter '" + params_.name(i) + "' " + std::to_string(listed[i]) +
             " times; list every parameter in exactly one bucket");
      if (s.offset + params_[i].numel > plan.sizes[s.bucket])
        return (policy + " places parameter '" + params_.name(i) + "' (" + std::to_string(params_[i].numel) +
             " elements) at offset " + std::to_string(s.offset) + " of bucket " + std::to_string(s.bucket) + ", which has " +
             std::to_string(plan.sizes[s.bucket]) + " elements; it must end inside its bucket");
      if (params_[i].numel) by_bucket[s.bucket].push_back(i);  // an empty parameter may share its place
    }
    for (auto& members : by_bucket) {
      std::sort(members.begin(), members.end(),
                [&](auto a, auto b) { return plan.slots[a].offset < plan.slots[b].offset; });
      for (std::size_t k = 1; k < members.size(); ++k) {
        const auto a = members[k - 1], b = members[k];
        if (plan.slots[a].offset + params_[a].numel > plan.slots[b].offset)
          return (policy + " gives parameters '" + params_.name(a) + "' and '" + params_.name(b) +
               "' overlapping places in bucket " + std::to_string(plan.slots[a].bucket) + " (offsets " +
               std::to_string(plan.slots[a].offset) + " and " + std::to_string(plan.slots[b].offset) +
               "); give each parameter a slot of its own");
      }
    }
    return std::nullopt;
  }

  // Every rank's part must be where the all_gather of the parameters puts it: equal blocks, rank
  // r's at r x shard. A layout that does not gather must at least stay inside the bucket.
  std::optional<std::string> layout_problem(const bucket_shape& s) const {
    const auto& l = s.layout;
    const std::string where = "the update policy '" + std::string(w_.update.name()) + "' lays out bucket " +
                              std::to_string(s.index) + " (" + std::to_string(s.numel) + " elements) as shard " +
                              std::to_string(l.shard) + " from " + std::to_string(l.begin) + " of " +
                              std::to_string(l.padded) + ": ";
    if (l.padded < s.numel) return (where + "`padded` must hold the bucket's elements");
    if (l.begin + l.shard > l.padded) return (where + "this rank's shard runs past `padded`");
    const auto ranks = static_cast<std::size_t>(comm_.size());
    if (w_.update.gathers_parameters() &&
        (l.padded != l.shard * ranks || l.begin != static_cast<std::size_t>(comm_.rank()) * l.shard))
      return (where + "a policy that gathers parameters must cut each bucket into equal shards, one per rank, rank r's "
           "starting at r x shard, with padded = shard x ranks (where all_gather puts them)");
    return std::nullopt;
  }

  // The step as the unused-parameter policy sees it.
  struct unused_view final : unused_params::step_view {
    explicit unused_view(gradient_reducer& r) : r(r) {}
    gradient_reducer& r;
    std::size_t parameter_count() const noexcept override { return r.params_.size(); }
    const std::string& parameter_name(std::size_t i) const override { return r.params_.name(i); }
    bool used(std::size_t i) const noexcept override { return r.used_[i] != 0; }
    bool all_buckets_sent() const noexcept override { return r.next_launch_ == r.buckets_.size(); }
    int rank() const noexcept override { return r.comm_.rank(); }
    int size() const noexcept override { return r.comm_.size(); }
    std::vector<std::uint8_t> all_gather(std::span<const std::uint8_t> mine) override {
      return comm::host_all_gather(r.comm_, r.device_, mine);
    }
  };

  Comm& comm_;
  Device& device_;
  parameter_table& params_;
  wiring w_;
  std::vector<bucket_type> buckets_;
  std::vector<char> used_;      // reported in any backward of this step
  std::vector<char> reported_;  // reported in the final backward
  bool backward_ran_ = false;   // in this step, on this rank
  std::size_t next_launch_ = 0;
  std::size_t next_complete_ = 0;  // buckets [0, next_complete_) completed their reduction in this step
  std::size_t micro_batches_ = 0;
  bool collecting_ = false;  // inside the step's final backward
  bool shadowing_ = false;
  bool capturing_ = false;
  bool overlaps_update_ = false;
  unused_view view_{*this};
  std::function<void(std::size_t, float*)> place_;  // the module's place_gradient
  std::function<void(std::size_t, float*)> place_values_;  // the module's place_parameter
  std::vector<device_array<Device, float>> spare_;  // gradient and parameter memory held by no bucket now
  std::vector<char> forwarded_, backwarded_;  // sharded parameters: through their layer's forward, backward
  bool pinned_ = false;  // gather_parameters() holds every bucket's parameters
  device_array<Device, float> control_;  // the control floats, when sent on their own
  std::optional<typename bucket_type::work_type> control_work_;
};

}  // namespace ddp::detail
