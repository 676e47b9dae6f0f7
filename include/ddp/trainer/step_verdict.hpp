#pragma once
// What every rank concluded from a step's averaged control floats (control_channel.hpp,
// parameter_usage.hpp): the mean micro-batch count over the ranks (0: every rank shadowed; 1
// under an exact sum, whose gradients are the average already), and which parameters the
// optimizer updates (the unused-parameter rule's say, by parameter index).
#include <span>

namespace ddp::detail {

struct step_verdict {
  float mean_micro_batches = 0.0f;
  std::span<const char> updated;  // owned by the reducer's parameter_usage, valid until the next step's ruling
};

}  // namespace ddp::detail
