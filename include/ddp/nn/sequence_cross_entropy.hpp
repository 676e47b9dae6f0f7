#pragma once
// Softmax cross-entropy over sequences: logits of B*T positions (row b*T + t), one target per
// position, averaged over the real positions.
//
//   sequence_cross_entropy(logits, targets)                    the mean over every position
//   sequence_cross_entropy(logits, targets, weights, length)   weights: a loader's per-sequence
//       sample weights (B of them); every position of sequence b weighs weights.per_sample[b],
//       and the sum is divided by weights.divisor() * length: padding sequences count for
//       nothing, and the step's gradient is the mean over the real positions of every rank's batch
//
// The result's loss_sum and samples count positions (a metric's mean loss per token); correct
// counts the positions whose arg-max is the target.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ddp/nn/cross_entropy.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::nn {

cross_entropy_result sequence_cross_entropy(const matrix& logits, std::span<const std::int32_t> targets,
                                            const sample_weights& weights, std::size_t length);

inline cross_entropy_result sequence_cross_entropy(const matrix& logits, std::span<const std::int32_t> targets) {
  return detail::softmax_cross_entropy(logits, targets, {}, static_cast<double>(std::max<std::size_t>(logits.rows, 1)),
                                       "ddp::nn::sequence_cross_entropy");
}

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE cross_entropy_result sequence_cross_entropy(const matrix& logits,
                                                               std::span<const std::int32_t> targets,
                                                               const sample_weights& weights, std::size_t length) {
  const std::string who = "ddp::nn::sequence_cross_entropy";
  if (length == 0 || logits.rows % length != 0)
    throw std::invalid_argument(who + ": " + std::to_string(logits.rows) + " rows of logits are not whole sequences of " +
                                std::to_string(length) + " positions; pass the batch's sequence length");
  const std::size_t sequences = logits.rows / length;
  if (weights.per_sample.size() != sequences)
    throw std::invalid_argument(who + ": " + std::to_string(sequences) + " sequences of " + std::to_string(length) +
                                " positions but " + std::to_string(weights.per_sample.size()) +
                                " sample weights; pass the batch's own weights, one per sequence");
  std::vector<float> per_position(logits.rows);
  for (std::size_t r = 0; r < logits.rows; ++r) per_position[r] = weights.per_sample[r / length];
  return detail::softmax_cross_entropy(logits, targets, per_position,
                                       weights.divisor() * static_cast<double>(length), "ddp::nn::sequence_cross_entropy");
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::nn
