#pragma once
// The softmax of multi-head attention on the CUDA device, and its backward, queued on its
// stream: ddp::nn::cuda's kernels (ddp/nn/cuda/kernels.hpp), one warp per row. The contract, and
// the host device's counterparts, are in ddp/host/attention_softmax.hpp. Declared in namespace
// ddp::cuda, beside the device, so that argument-dependent lookup finds them as it finds the
// host device's (and ddp/cuda/linalg.hpp's); they live here, above ddp/cuda/, because the
// kernels are the reference layers'.
#include <cstddef>

#include "ddp/cuda/device.hpp"
#include "ddp/nn/cuda/kernels.hpp"

namespace ddp::cuda {

inline void attention_softmax(device& dev, const float* scores, float* probs, std::size_t matrices, std::size_t rows,
                              std::size_t cols, float scale, bool causal) {
  check(nn::cuda::kernels::attention_softmax(scores, probs, matrices, rows, cols, scale, causal, dev.stream()),
        "attention_softmax kernel", dev.site());
}

inline void attention_softmax_backward(device& dev, const float* probs, const float* dprobs, float* dscores,
                                       std::size_t matrices, std::size_t rows, std::size_t cols, float scale,
                                       bool causal) {
  check(nn::cuda::kernels::attention_softmax_backward(probs, dprobs, dscores, matrices, rows, cols, scale, causal,
                                                      dev.stream()),
        "attention_softmax_backward kernel", dev.site());
}

}  // namespace ddp::cuda
