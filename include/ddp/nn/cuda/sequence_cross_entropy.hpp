#pragma once
// Softmax cross-entropy over sequences of GPU logits (B*T positions, row b*T + t), averaged over
// the real positions: ddp::nn::sequence_cross_entropy's weighting on ddp::nn::cuda's softmax
// cross-entropy. The targets are on the device, one per position.
//
//   sequence_cross_entropy(logits, targets)                    the mean over every position
//   sequence_cross_entropy(logits, targets, weights, length)   every position of sequence b weighs
//       weights.per_sample[b]; the sum is divided by weights.divisor() * length
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/core/sample_weights.hpp"
#include "ddp/nn/cuda/cross_entropy.hpp"
#include "ddp/nn/sequence_cross_entropy.hpp"

namespace ddp::nn::cuda {

inline cross_entropy_result sequence_cross_entropy(const matrix& logits,
                                                   const ddp::cuda::device_vector<std::int32_t>& targets) {
  return softmax_cross_entropy(logits, targets);
}

inline cross_entropy_result sequence_cross_entropy(const matrix& logits,
                                                   const ddp::cuda::device_vector<std::int32_t>& targets,
                                                   const sample_weights& weights, std::size_t length) {
  const std::string who = "ddp::nn::cuda::sequence_cross_entropy";
  if (length == 0 || logits.rows() % length != 0)
    throw std::invalid_argument(who + ": " + std::to_string(logits.rows()) +
                                " rows of logits are not whole sequences of " + std::to_string(length) +
                                " positions; pass the batch's sequence length");
  const std::size_t sequences = logits.rows() / length;
  if (weights.per_sample.size() != sequences)
    throw std::invalid_argument(who + ": " + std::to_string(sequences) + " sequences of " + std::to_string(length) +
                                " positions but " + std::to_string(weights.per_sample.size()) +
                                " sample weights; pass the batch's own weights, one per sequence");
  std::vector<float> per_position(logits.rows());
  for (std::size_t r = 0; r < logits.rows(); ++r) per_position[r] = weights.per_sample[r / length];
  return detail::softmax_cross_entropy(logits, targets, per_position, weights.divisor() * static_cast<double>(length));
}

}  // namespace ddp::nn::cuda
