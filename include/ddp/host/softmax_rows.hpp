#pragma once
// The attention softmax's row loops on host memory, vectorised: the kernels behind the host
// device's attention_softmax (ddp/host/attention_softmax.hpp, whose contract they keep) and the
// host attention layer (ddp::nn::attention).
//
// `matrices` row-major rows x cols matrices, one after another; under `causal` row i of each keeps
// columns 0..i. Forward: p[j] = e^(scale s[j] - m) / sum over kept k of e^(scale s[k] - m), m the
// row's largest kept scale s[k], the columns past the kept ones exactly +0; probs may be scores.
// Backward: ds[j] = scale p[j] (dp[j] - sum over kept k of p[k] dp[k]), +0 past the kept ones;
// dscores may be dprobs. In f32: e^x by ddp::host::exp_f32, the row's sums over fixed lanes.
#include <algorithm>
#include <cstddef>

#include "ddp/core/vectorize.hpp"
#include "ddp/host/vector_math.hpp"

namespace ddp::host {

DDP_VECTORIZE DDP_WIDE_VECTORS DDP_EXACT_FLOATS inline void softmax_rows(const float* scores, float* probs,
                                                                         std::size_t matrices, std::size_t rows,
                                                                         std::size_t cols, float scale,
                                                                         bool causal) noexcept {
  for (std::size_t r = 0; r < matrices * rows; ++r) {
    const std::size_t i = r % rows, kept = causal ? std::min(i + 1, cols) : cols;
    const float* s = scores + r * cols;
    float* p = probs + r * cols;
    const float top = lane_max(kept, [&](std::size_t j) { return scale * s[j]; });
    for (std::size_t j = 0; j < kept; ++j) p[j] = exp_f32(scale * s[j] - top);
    const float inverse = 1.0f / lane_sum(kept, [&](std::size_t j) { return p[j]; });
    for (std::size_t j = 0; j < kept; ++j) p[j] *= inverse;
    for (std::size_t j = kept; j < cols; ++j) p[j] = 0.0f;
  }
}

DDP_VECTORIZE DDP_WIDE_VECTORS DDP_EXACT_FLOATS inline void softmax_rows_backward(const float* probs,
                                                                                  const float* dprobs, float* dscores,
                                                                                  std::size_t matrices,
                                                                                  std::size_t rows, std::size_t cols,
                                                                                  float scale, bool causal) noexcept {
  for (std::size_t r = 0; r < matrices * rows; ++r) {
    const std::size_t i = r % rows, kept = causal ? std::min(i + 1, cols) : cols;
    const float* p = probs + r * cols;
    const float* dp = dprobs + r * cols;
    float* ds = dscores + r * cols;
    const float dot = lane_sum(kept, [&](std::size_t j) { return p[j] * dp[j]; });
    for (std::size_t j = 0; j < kept; ++j) ds[j] = scale * (p[j] * (dp[j] - dot));
    for (std::size_t j = kept; j < cols; ++j) ds[j] = 0.0f;
  }
}

}  // namespace ddp::host
