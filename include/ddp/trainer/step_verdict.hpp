#pragma once
// What every rank concluded from a step's averaged control floats (control_channel.hpp): the
// mean micro-batch count over the ranks (0: every rank shadowed; 1 under an exact sum, whose
// gradients are the average already). Which parameters the optimizer updates, the unused-parameter
// rule's say, is written beside it into the update stage's mask.

namespace ddp::detail {

struct step_verdict {
  float mean_micro_batches = 0.0f;
};

}  // namespace ddp::detail
