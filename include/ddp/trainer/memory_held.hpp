#pragma once
// What a rank holds for its parameters, gradients and optimizer state, in bytes, as the trainer's
// components count it: the module's own storage (the parameters and gradients it keeps itself,
// not bound into the trainer's memory) and what the trainer allocated on its device. The figures
// a memory formula per update policy is checked against (docs/choosing-policies.md).
#include <cstddef>

namespace ddp {

struct memory_held {
  std::size_t parameters = 0;       // the module's own values, the gathered copy, f32 masters of 16-bit ones
  std::size_t gradients = 0;        // the module's own gradients, the buckets' (whole, or this rank's shard), control floats
  std::size_t optimizer_state = 0;  // this rank's shard of the optimizer state
  std::size_t total() const noexcept { return parameters + gradients + optimizer_state; }
  memory_held operator+(const memory_held& o) const noexcept {
    return {parameters + o.parameters, gradients + o.gradients, optimizer_state + o.optimizer_state};
  }
};

}  // namespace ddp
