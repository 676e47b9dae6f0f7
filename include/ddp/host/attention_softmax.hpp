#pragma once
// The softmax of multi-head attention on the host device, and its backward: the contract that
// every device's attention_softmax keeps (found by argument-dependent lookup; the CUDA device's
// is in ddp/nn/cuda/attention_softmax.hpp), checked on both by the device conformance suite.
//
// Scores, probabilities and their gradients are `matrices` row-major rows x cols matrices, one
// after another (one per sequence and head); probs may be scores, and dscores dprobs (in place).
// Everything is f32:
//   probs[i, j] = exp(scale * s[i, j] - m) / sum over kept k of exp(scale * s[i, k] - m),
//   m the row's largest scale * s[i, k] among the kept columns;
//   causal: row i keeps columns 0..i; the columns past i are exactly +0, in probs and in the
//   gradient alike (the gradient with respect to a future token is exactly zero).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "ddp/host/device.hpp"

namespace ddp::host {

inline void attention_softmax(device&, const float* scores, float* probs, std::size_t matrices, std::size_t rows,
                              std::size_t cols, float scale, bool causal) {
  for (std::size_t r = 0; r < matrices * rows; ++r) {
    const std::size_t i = r % rows, kept = causal ? std::min(i + 1, cols) : cols;
    const float* s = scores + r * cols;
    float* p = probs + r * cols;
    float top = -std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < kept; ++j) top = std::max(top, scale * s[j]);
    float sum = 0.0f;
    for (std::size_t j = 0; j < kept; ++j) sum += (p[j] = std::exp(scale * s[j] - top));
    const float inverse = 1.0f / sum;
    for (std::size_t j = 0; j < kept; ++j) p[j] *= inverse;
    std::fill(p + kept, p + cols, 0.0f);
  }
}

// dscores = scale * p * (dp - sum over the row's kept columns of p * dp)
inline void attention_softmax_backward(device&, const float* probs, const float* dprobs, float* dscores,
                                       std::size_t matrices, std::size_t rows, std::size_t cols, float scale,
                                       bool causal) {
  for (std::size_t r = 0; r < matrices * rows; ++r) {
    const std::size_t i = r % rows, kept = causal ? std::min(i + 1, cols) : cols, at = r * cols;
    float dot = 0.0f;
    for (std::size_t j = 0; j < kept; ++j) dot += probs[at + j] * dprobs[at + j];
    for (std::size_t j = 0; j < kept; ++j) dscores[at + j] = scale * (probs[at + j] * (dprobs[at + j] - dot));
    std::fill(dscores + at + kept, dscores + at + cols, 0.0f);
  }
}

}  // namespace ddp::host
