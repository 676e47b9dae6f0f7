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
