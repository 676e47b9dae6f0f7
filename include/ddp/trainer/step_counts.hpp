#pragma once
// The trainer's host-side counts of a run: steps, micro-batches, and each parameter's update
// count. A step captured into a CUDA graph runs on the host once, at capture: what it advanced
// is put back and kept as a difference, which every replay adds.
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ddp::detail {

struct step_counts {
  std::uint64_t steps = 0, micro_batches = 0;
  std::vector<std::int64_t> update_counts;  // per parameter

  step_counts operator-(const step_counts& before) const {
    step_counts d{steps - before.steps, micro_batches - before.micro_batches, update_counts};
    for (std::size_t i = 0; i < d.update_counts.size(); ++i) d.update_counts[i] -= before.update_counts[i];
    return d;
  }
  step_counts& operator+=(const step_counts& added) {
    steps += added.steps, micro_batches += added.micro_batches;
    for (std::size_t i = 0; i < update_counts.size(); ++i) update_counts[i] += added.update_counts[i];
    return *this;
  }
};

// The run's step counts, which the trainer core keeps: steps taken, micro-batches run (accumulate
// and step calls), and those of the steps that completed (the trainer's position in an epoch at
// a hand-over). A captured step's difference (step_counts) is put back and added per replay.
class run_counts {
 public:
  std::uint64_t steps() const noexcept { return steps_; }
  std::uint64_t micro_batches_run() const noexcept { return micro_batches_run_; }
  std::uint64_t micro_batches_completed() const noexcept { return micro_batches_completed_; }
  // The step count as it goes, for the parts that read it while a step runs (the buffer-sync
  // context, the reducer); and for a load, which sets it.
  const std::uint64_t& current_step() const noexcept { return steps_; }
  std::uint64_t& loaded_steps() noexcept { return steps_; }

  void micro_batch_begins() noexcept { ++micro_batches_run_; }
  // The step's micro-batches are done with (a step counted, or a shadow step that updated nothing).
  void step_ends() noexcept { micro_batches_completed_ = micro_batches_run_; }
  void step_counted() noexcept { ++steps_; }

  // These counts with the update counts per parameter of `update` (the update stage).
  template <class Update>
  step_counts with(const Update& update) const {
    return {steps_, micro_batches_run_, update.update_counts()};
  }
  // Back to `c`, the update counts into `update`: every micro-batch run completed.
  template <class Update>
  void set(step_counts c, Update& update) {
    steps_ = c.steps;
    micro_batches_run_ = micro_batches_completed_ = c.micro_batches;
    update.set_update_counts(std::move(c.update_counts));
  }

 private:
  std::uint64_t steps_ = 0;
  std::uint64_t micro_batches_run_ = 0;
  std::uint64_t micro_batches_completed_ = 0;
};

// Runs `f` when the scope ends, however it ends.
template <class F>
class at_scope_exit {
 public:
  explicit at_scope_exit(F f) : f_(std::move(f)) {}
  at_scope_exit(const at_scope_exit&) = delete;
  at_scope_exit& operator=(const at_scope_exit&) = delete;
  ~at_scope_exit() { f_(); }

 private:
  F f_;
};

}  // namespace ddp::detail
