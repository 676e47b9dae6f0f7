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
// The loops are ddp/host/softmax_rows.hpp's (vectorised; e^x within 2 units in the last place).
#include <cstddef>

#include "ddp/host/device.hpp"
#include "ddp/host/softmax_rows.hpp"

namespace ddp::host {

inline void attention_softmax(device&, const float* scores, float* probs, std::size_t matrices, std::size_t rows,
                              std::size_t cols, float scale, bool causal) {
  softmax_rows(scores, probs, matrices, rows, cols, scale, causal);
}

// dscores = scale * p * (dp - sum over the row's kept columns of p * dp)
inline void attention_softmax_backward(device&, const float* probs, const float* dprobs, float* dscores,
                                       std::size_t matrices, std::size_t rows, std::size_t cols, float scale,
                                       bool causal) {
  softmax_rows_backward(probs, dprobs, dscores, matrices, rows, cols, scale, causal);
}

}  // namespace ddp::host
