#pragma once
// The update stage: from the averaged gradients to updated parameters. It owns what the update
// keeps across steps: the optimizer's state (per bucket, this rank's shard of it), each
// parameter's update count (AdamW's bias correction), the parameter groups and the clipping norm.
// Which parameters a step updates comes with its verdict (the unused-parameter rule's say).
//
//   run(): gradients / mean micro-batch count -> [clip by global norm] -> optimizer on this
//          rank's shard of every bucket -> zero the gradients -> [all_gather the updated shards,
//          when the update policy's memory plan keeps a gathered copy] -> the parameters where
//          the module reads them
//
// When the update overlaps the reductions (trainer.overlap_optimizer), each bucket goes through
// those stages as soon as its own reduction completed, while later buckets still reduce. Clipping
// needs the norm of every bucket first: with it, every reduction completes before the first
// bucket is updated, as without overlap. A step that fails after its update began leaves a torn
// state (some buckets at the new step, some at the old), which require_whole() refuses to write.
//
// Every element goes through the same arithmetic whatever the update policy's layout, so a
// sharded update gives the bits of a replicated one.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ddp/comm/host_collectives.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"
#include "ddp/core/error.hpp"
#include "ddp/optim/parameter_group.hpp"
#include "ddp/trainer/bucket.hpp"
#include "ddp/trainer/checkpoint_file.hpp"
#include "ddp/trainer/bucket_layout.hpp"
#include "ddp/trainer/completed_buckets.hpp"
#include "ddp/trainer/parameter_table.hpp"
#include "ddp/trainer/parts.hpp"
#include "ddp/trainer/step_observer.hpp"
#include "ddp/trainer/step_verdict.hpp"

namespace ddp::detail {

template <communicator Comm, device Device>
class update_stage {
 public:
  using bucket_type = bucket<Comm, Device>;

  // `exact_norm`: the gradient norm is summed exactly (under reduction::invariant).
  update_stage(Comm& comm, Device& dev, optimizer_part<Device>& optimizer, update::memory_plan memory,
               const parameter_table& params, std::span<const bucket_type> buckets, bool exact_norm)
      : comm_(comm), device_(dev), optimizer_(optimizer), memory_(memory), params_(params), exact_norm_(exact_norm) {
    const auto slots = static_cast<std::size_t>(optimizer.state_slots());
    for (const auto& bk : buckets) state_.push_back(zeroed_array<float>(dev, bk.shard() * slots));
    update_counts_.assign(params.size(), 0);
  }

  // The buckets come completed (completed_buckets.hpp): one by one as the stage reaches them when
  // the update overlaps the reductions, else all before the first is updated.
  void run(const completed_buckets<bucket_type>& completed, step_verdict verdict, const step_observer& observer,
           std::uint64_t step) {
    const bool bucket_by_bucket = completed.overlapped() && max_gradient_norm_ == 0.0f;
    const bool scales = verdict.mean_micro_batches != 1.0f;
    const float inverse = 1.0f / verdict.mean_micro_batches;
    gradient_norm_ = 0.0;  // this step's, when it clips
    if (!bucket_by_bucket) {
      const auto buckets = completed.all();
      if (scales)
        for (auto& bk : buckets) device_.scale(bk.gradient_shard(), bk.shard(), inverse);
      if (max_gradient_norm_ > 0.0f) clip(buckets);
    }
    for (auto it = completed.begin(); it != completed.end(); ++it) {
      auto& bk = *it;  // its reduction completed
      if (bucket_by_bucket && scales) device_.scale(bk.gradient_shard(), bk.shard(), inverse);
      if (optimizer_.applies_update()) {
        torn_ = true;  // from the first bucket updated until every one is
        apply_optimizer(bk, state_[it.index()], verdict.updated);
        bk.zero_gradients();
      } else {  // the caller's optimizer steps, and zeroes, from the averaged gradients
        bk.unpack_gradients();
      }
      if (memory_.gathers_after_update()) bk.all_gather_parameters();
    }
    {
      auto gather = observer.phase_if(memory_.gathers_parameters(), "gather parameters", step);
      if (memory_.gathers_after_update())
        for (auto& bk : completed.all()) bk.finish_parameters();
    }
    if (bucket_by_bucket) completed.confirm_collectives();
    torn_ = false;
    observer.updated(step);
  }
  // Before this rank's state is written (a checkpoint, or the hand-over of elastic training): a
  // step that failed after its update began left some buckets (or shards) at the new step's
  // values and others at the old, a state of neither step.
  void require_whole(std::uint64_t steps) const {
    if (torn_)
      throw error("trainer", "state", comm_.rank(),
                  "the step after the " + std::to_string(steps) + " completed ones failed after its update had "
                  "begun, so part of the parameters and optimizer state hold that step and part the one before: "
                  "resume from the last checkpoint");
  }

  // ---- clipping and parameter groups --------------------------------------------------------

  // Gradient clipping by global norm: from the next step on, the averaged gradient of the whole
  // model (every bucket, every rank's shard under a sharded update) is scaled by
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
  // that selects none is an error listing a few names. Call it on every rank alike.
  std::size_t set_parameter_group(const optim::parameter_selector& select, const optim::parameter_group& group) {
    if (group.weight_decay && !optimizer_.has_weight_decay())
      throw error("trainer", "set_parameter_group", comm_.rank(),
                  "the group sets weight_decay, but the optimizer has no `float weight_decay` member to replace");
    if (group_of_.empty()) group_of_.assign(params_.size(), 0);
    groups_.push_back(group);
    std::size_t selected = 0;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (select(params_.name(i))) group_of_[i] = groups_.size(), ++selected;
    if (selected == 0) {
      std::string names;
      for (std::size_t i = 0; i < params_.size() && i < 4; ++i) names += (i ? ", '" : "'") + params_.name(i) + "'";
      throw error("trainer", "set_parameter_group", comm_.rank(),
                  "the selector matched no parameter; the names are like " + names);
    }
    return selected;
  }
  std::size_t group_count() const noexcept { return groups_.size(); }

  // The optimizer state this rank keeps, in bytes.
  std::size_t state_bytes() const noexcept {
    std::size_t floats = 0;
    for (const auto& s : state_) floats += s.size();
    return floats * sizeof(float);
  }

  // ---- capture -------------------------------------------------------------------------------

  std::optional<std::string> capture_refusal() const {
    if (!optimizer_.applies_update())
      return "optim::external leaves the update to an optimizer outside the trainer, which the graph cannot hold";
    if (const auto varies = optimizer_.rule_varies_with_step(); !varies || *varies)
      return varies ? "the optimizer's update rule changes with every update count (AdamW's bias correction), "
                      "but a captured step replays the rule it was captured with: use an optimizer whose rule "
                      "does not depend on the step (ddp::optim::sgd)"
                    : "the optimizer's rule has no operator==, so a captured step cannot tell whether it changes "
                      "with the update count: give the rule `bool operator==(const rule&) const = default;`";
    if (max_gradient_norm_ > 0.0f)
      return "gradient clipping reads the gradient norm on the host every step; clip_gradient_norm(0) to capture";
    return std::nullopt;
  }
  // Each parameter's update count: what a captured step adds, put back, and added per replay.
  const std::vector<std::int64_t>& update_counts() const noexcept { return update_counts_; }
  void set_update_counts(std::vector<std::int64_t> counts) { update_counts_ = std::move(counts); }

  // ---- checkpoint sections: "state_slots", "update_counts", "state/<bucket>" ---------------

  void write_state(checkpoint_file& f) const {
    f.set_text("state_slots", std::to_string(optimizer_.state_slots()));
    f.set_array("update_counts", std::span<const std::int64_t>(update_counts_));
    for (std::size_t i = 0; i < state_.size(); ++i) {
      std::vector<float> s(state_[i].size());
      if (!s.empty()) device_.copy_to_host(s.data(), state_[i].data(), s.size() * sizeof(float));
      f.set_array("state/" + std::to_string(i), std::span<const float>(s));
    }
  }
  std::optional<std::string> check_state(const checkpoint_file& f) const {
    const auto slots = std::to_string(optimizer_.state_slots());
    if (f.text("state_slots") != slots)
      return "'" + f.path() + "' holds " + f.text("state_slots") + " optimizer state value(s) per parameter, this "
             "trainer's optimizer keeps " + slots;
    return std::nullopt;
  }
  // The optimizer state of each bucket is assembled from the files' shards, which may be cut for
  // another world size (a sharded update: the shards re-cut); the counts come from `own`.
  void read_state(const std::vector<checkpoint_file>& files, std::size_t own, std::span<const bucket_type> buckets) {
    torn_ = false;
    update_counts_ = files[own].array<std::int64_t>("update_counts", params_.size());
    const auto slots = static_cast<std::size_t>(optimizer_.state_slots());
    std::vector<std::vector<saved_bucket>> layouts;
    for (const auto& file : files) layouts.push_back(saved_bucket_layout(file));
    for (std::size_t i = 0; i < buckets.size(); ++i) {
      const auto& bk = buckets[i];
      std::vector<float> mine(state_[i].size(), 0.0f);
      // Each file's shard [begin, begin + shard) of every slot; this rank's own last, so that where
      // shards overlap (a replicated update) its own state wins: between a sync schedule's syncs
      // each rank's optimizer state is its own.
      for (std::size_t n = 0; n < files.size(); ++n) {
        const std::size_t j = n + 1 == files.size() ? own : n + (n >= own);
        const std::size_t begin = layouts[j].at(i)[2], shard = layouts[j].at(i)[3];
        const auto theirs = files[j].array<float>("state/" + std::to_string(i), slots * shard);
        const std::size_t lo = std::max(begin, bk.shard_begin()), hi = std::min(begin + shard, bk.shard_begin() + bk.shard());
        for (std::size_t k = 0; k < slots && lo < hi; ++k)
          std::copy(theirs.begin() + static_cast<std::ptrdiff_t>(k * shard + lo - begin),
                    theirs.begin() + static_cast<std::ptrdiff_t>(k * shard + hi - begin),
                    mine.begin() + static_cast<std::ptrdiff_t>(k * bk.shard() + lo - bk.shard_begin()));
      }
      if (!mine.empty()) device_.copy_from_host(state_[i].data(), mine.data(), mine.size() * sizeof(float));
    }
  }

 private:
  // Updates this rank's shard of the bucket (all of it when replicated); segment offsets, and
  // the gradient and state pointers, count from the shard's start. One update call per run of
  // parameters with the same update count and parameter group.
  void apply_optimizer(bucket_type& bk, device_array<Device, float>& state, std::span<const char> updated) {
    std::vector<segment> segs;
    std::vector<std::int64_t> counts;
    std::vector<std::size_t> groups;
    for (const auto i : bk.parameters()) {
      if (!updated[i]) continue;
      const auto count = ++update_counts_[i];
      const auto& p = params_[i];
      const segment part = bk.shard_part({p.value, p.slot.offset, p.numel});
      if (part.count == 0) continue;
      segs.push_back(part);
      counts.push_back(count);
      groups.push_back(group_of_.empty() ? 0 : group_of_[i]);
    }
    const float* grad = bk.gradient_shard();
    for (std::size_t begin = 0, end; begin < segs.size(); begin = end) {
      for (end = begin + 1; end < segs.size() && counts[end] == counts[begin] && groups[end] == groups[begin];) ++end;
      optimizer_.update(device_, std::span(segs).subspan(begin, end - begin), grad, state.data(), bk.shard(),
                        counts[begin], groups[begin] ? &groups_[groups[begin] - 1] : nullptr);
    }
  }

  // The norm of the whole averaged gradient: where the layout gives each rank a disjoint shard
  // of a bucket (a sharded update), the shards' sums of squares are summed over the ranks (one
  // small all-reduce); the layouts are alike on every rank, so all decide alike.
  void clip(std::span<bucket_type> buckets) {
    gradient_norm_ = std::sqrt(exact_norm_ ? exact_sum_of_squares(buckets) : sum_of_squares(buckets));
    const double coefficient = static_cast<double>(max_gradient_norm_) / (gradient_norm_ + 1e-6);  // as PyTorch's
    if (coefficient >= 1.0) return;
    for (auto& bk : buckets) device_.scale(bk.gradient_shard(), bk.shard(), static_cast<float>(coefficient));
  }

  double sum_of_squares(std::span<bucket_type> buckets) {
    double sum = 0.0;
    bool sharded = false;
    for (auto& bk : buckets) {
      sum += device_.sum_of_squares(bk.gradient_shard(), bk.shard());
      sharded = sharded || bk.sharded();
    }
    if (sharded) comm::host_all_reduce(comm_, device_, std::span<double>(&sum, 1), reduce_op::sum);
    return sum;
  }
  // Exact (reduction::exact::square_sum): the same bits at every world size, sharded or not.
  double exact_sum_of_squares(std::span<bucket_type> buckets) {
    reduction::exact::square_sum sum;
    bool sharded = false;
    std::vector<float> staged;
    for (auto& bk : buckets) {
      sharded = sharded || bk.sharded();
      if constexpr (Device::kind == device_kind::cpu) {
        sum.add({bk.gradient_shard(), bk.shard()});
      } else {
        staged.resize(bk.shard());
        device_.copy_to_host(staged.data(), bk.gradient_shard(), staged.size() * sizeof(float));
        sum.add(staged);
      }
    }
    sum.normalize();
    if (sharded) comm::host_all_reduce(comm_, device_, std::span<std::int64_t>(sum.data()), reduce_op::sum);
    return sum.value();
  }

  Comm& comm_;
  Device& device_;
  optimizer_part<Device>& optimizer_;
  update::memory_plan memory_;  // the update policy's
  const parameter_table& params_;
  std::vector<device_array<Device, float>> state_;  // per bucket: state_slots x shard floats
  std::vector<std::int64_t> update_counts_;
  std::vector<optim::parameter_group> groups_;  // set_parameter_group's, in order
  std::vector<std::size_t> group_of_;           // per parameter: 0, or 1 + its index in groups_
  float max_gradient_norm_ = 0.0f;              // 0: no clipping
  double gradient_norm_ = 0.0;
  bool exact_norm_ = false;
  bool torn_ = false;
};

}  // namespace ddp::detail
