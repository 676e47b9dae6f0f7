#pragma once
// Softmax cross-entropy over a batch: the loss, its gradient with respect to the logits, and what
// a reduced metric needs (the sum of the per-sample losses, the samples counted, the correct ones).
//
//   softmax_cross_entropy(logits, labels)            the mean over the batch
//   softmax_cross_entropy(logits, labels, weights)   each sample's loss times its weight, summed
//       and divided by weights.divisor(): with a loader's weights (ddp::data::loader), padding
//       counts for nothing and the step's gradient is the mean over the real samples of every
//       rank's batch (ddp/core/sample_weights.hpp)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/core/sample_weights.hpp"
#include "ddp/nn/matrix.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::nn {

// The result on the host and on the GPU (ddp::nn::cuda), over either's matrix.
template <class Matrix>
struct basic_cross_entropy_result {
  double loss = 0.0;        // the loss `grad` is the gradient of
  Matrix grad;              // d loss / d logits
  std::size_t correct = 0;  // right predictions among the counted samples (weight > 0)
  double loss_sum = 0.0;    // sum over the samples of weight * loss: a metric's sum
  double samples = 0.0;     // sum of the weights (the batch size when unweighted): a metric's count
};
using cross_entropy_result = basic_cross_entropy_result<matrix>;

namespace detail {

// The checks both devices make before any work; `who` names the function in the message.
void check_cross_entropy_arguments(const std::string& who, std::size_t rows, std::size_t labels,
                                   std::size_t weights, double divisor);
cross_entropy_result softmax_cross_entropy(const matrix& logits, std::span<const std::int32_t> labels,
                                           std::span<const float> weights, double divisor,
                                           const char* who = "ddp::nn::softmax_cross_entropy");

#if DDP_RUNTIME_DEFINITIONS
DDP_RUNTIME_INLINE void check_cross_entropy_arguments(const std::string& who, std::size_t rows,
                                                      std::size_t labels, std::size_t weights, double divisor) {
  if (labels != rows)
    throw std::invalid_argument(who + ": " + std::to_string(rows) + " rows of logits but " + std::to_string(labels) +
                                " labels");
  if (weights != 0 && weights != rows)
    throw std::invalid_argument(who + ": " + std::to_string(rows) + " rows of logits but " + std::to_string(weights) +
                                " sample weights (pass the batch's own weights)");
  if (!(divisor > 0))
    throw std::invalid_argument(who + ": the weights' divisor is " + std::to_string(divisor) +
                                "; it must be positive (a step's weights must sum to more than zero)");
}

// weights empty: every sample weighs 1. Each row's loss and gradient are scaled by weight / divisor.
DDP_RUNTIME_INLINE cross_entropy_result softmax_cross_entropy(const matrix& logits,
                                                              std::span<const std::int32_t> labels,
                                                              std::span<const float> weights, double divisor,
                                                              const char* who) {
  check_cross_entropy_arguments(who, logits.rows, labels.size(), weights.size(), divisor);
  cross_entropy_result out{0.0, matrix(logits.rows, logits.cols), 0, 0.0, 0.0};
  const double inv_divisor = 1.0 / divisor;
  std::vector<double> e(logits.cols);  // a row's exp(z - max z)
  for (std::size_t r = 0; r < logits.rows; ++r) {
    const float* z = logits.row(r);
    const auto label = static_cast<std::size_t>(labels[r]);
    if (labels[r] < 0 || label >= logits.cols)
      throw std::invalid_argument(std::string(who) + ": label " + std::to_string(labels[r]) +
                                  " outside [0, " + std::to_string(logits.cols) + ")");
    const double weight = weights.empty() ? 1.0 : static_cast<double>(weights[r]);
    const double scale = weight * inv_divisor;
    const float zmax = *std::max_element(z, z + logits.cols);
    double sum = 0.0;
    for (std::size_t c = 0; c < logits.cols; ++c) sum += e[c] = std::exp(static_cast<double>(z[c] - zmax));
    const double log_sum = std::log(sum), inv_sum = 1.0 / sum;
    const double loss = log_sum - static_cast<double>(z[label] - zmax);
    out.loss += loss * scale;
    out.loss_sum += loss * weight;
    out.samples += weight;
    float* g = out.grad.row(r);
    for (std::size_t c = 0; c < logits.cols; ++c)
      g[c] = static_cast<float>((e[c] * inv_sum - (c == label)) * scale);
    if (weight > 0 && static_cast<std::size_t>(std::max_element(z, z + logits.cols) - z) == label) ++out.correct;
  }
  return out;
}
#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace detail

inline cross_entropy_result softmax_cross_entropy(const matrix& logits, std::span<const std::int32_t> labels) {
  return detail::softmax_cross_entropy(logits, labels, {}, static_cast<double>(std::max<std::size_t>(logits.rows, 1)));
}

inline cross_entropy_result softmax_cross_entropy(const matrix& logits, std::span<const std::int32_t> labels,
                                                  const sample_weights& weights) {
  return detail::softmax_cross_entropy(logits, labels, weights.per_sample, weights.divisor());
}

}  // namespace ddp::nn
