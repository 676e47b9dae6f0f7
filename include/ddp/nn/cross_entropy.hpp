#pragma once
// Softmax cross-entropy over a batch: mean loss, the gradient of that mean with respect to the
// logits, and how many predictions were right.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

#include "ddp/nn/matrix.hpp"

namespace ddp::nn {

struct cross_entropy_result {
  double loss = 0.0;     // mean over the batch
  matrix grad;           // d loss / d logits
  std::size_t correct = 0;
};

inline cross_entropy_result softmax_cross_entropy(const matrix& logits, std::span<const std::int32_t> labels) {
  if (labels.size() != logits.rows)
    throw std::invalid_argument("ddp::nn::softmax_cross_entropy: " + std::to_string(logits.rows) +
                                " rows of logits but " + std::to_string(labels.size()) + " labels");
  cross_entropy_result out{0.0, matrix(logits.rows, logits.cols), 0};
  const double inv_n = logits.rows ? 1.0 / static_cast<double>(logits.rows) : 0.0;
  for (std::size_t r = 0; r < logits.rows; ++r) {
    const float* z = logits.row(r);
    const auto label = static_cast<std::size_t>(labels[r]);
    if (labels[r] < 0 || label >= logits.cols)
      throw std::invalid_argument("ddp::nn::softmax_cross_entropy: label " + std::to_string(labels[r]) +
                                  " outside [0, " + std::to_string(logits.cols) + ")");
    const float zmax = *std::max_element(z, z + logits.cols);
    double sum = 0.0;
    for (std::size_t c = 0; c < logits.cols; ++c) sum += std::exp(static_cast<double>(z[c] - zmax));
    const double log_sum = std::log(sum);
    out.loss += (log_sum - static_cast<double>(z[label] - zmax)) * inv_n;
    float* g = out.grad.row(r);
    for (std::size_t c = 0; c < logits.cols; ++c)
      g[c] = static_cast<float>((std::exp(static_cast<double>(z[c] - zmax) - log_sum) - (c == label)) * inv_n);
    if (static_cast<std::size_t>(std::max_element(z, z + logits.cols) - z) == label) ++out.correct;
  }
  return out;
}

}  // namespace ddp::nn
