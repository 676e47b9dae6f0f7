#pragma once
// The CUDA device's kernels, as host functions that enqueue them on a stream. Declared here so
// host translation units (compiled by g++) call them; defined in ddp/cuda/kernels.cuh, which
// one nvcc translation unit compiles: ddp::cuda adds that unit to its consumer (src/cuda/kernels.cu).
// Each returns the launch status (cudaGetLastError); none synchronises.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ddp/core/dtype.hpp"
#include "ddp/core/segment.hpp"

namespace ddp::cuda::kernels {

// How wide a launch may go: blocks per grid-stride kernel (a few waves of the device's SMs).
// What sizes a grid: the device's multiprocessors. Each kernel's grid is as many blocks as fit
// resident on them at once (its occupancy, from its registers and shared memory), so a
// grid-stride kernel runs in one wave.
struct launch_limits {
  int multiprocessors = 128;
};

enum class direction { pack, unpack };

// pack: bucket[s.offset ..] = s.tensor[..]; unpack: the other way; for every segment.
cudaError_t copy_segments(const segment* segments, std::size_t count, float* bucket, direction d,
                          launch_limits, cudaStream_t);
// x[i] *= factor
cudaError_t scale(float* x, std::size_t n, float factor, launch_limits, cudaStream_t);
// *result = the sum of x[i]^2 in double, in a fixed order (each block's part into partials[b],
// then one block sums those): the same bits on every run. partials holds sum_of_squares_blocks.
inline constexpr unsigned sum_of_squares_blocks = 256;
cudaError_t sum_of_squares(const float* x, std::size_t n, double* partials, double* result, cudaStream_t);
// dst = src * factor, f32 -> f16 / bf16 (the product rounded in f32 first), or f16 / bf16 -> f32
// (factor ignored: the caller passes 1), n elements; false (nothing launched) for another pair.
// The host's bits (ddp/host/half.hpp), NaNs included: a NaN source is not multiplied, and becomes
// a quiet NaN of its sign with its payload's top bits (narrowing) or zeros appended (widening).
bool cast(const void* src, dtype from, void* dst, dtype to, std::size_t n, float factor, launch_limits, cudaStream_t,
          cudaError_t& status);
// Gram-Schmidt over the columns of a row-major rows x cols matrix, in one block: each column
// divided by its norm plus eps, then taken out of the columns after it (sums in double, in a fixed order).
cudaError_t orthonormalize_columns(float* a, std::size_t rows, std::size_t cols, float eps, cudaStream_t);
// An optimizer's element rule (ddp/optim/optimizer.hpp) per segment: parameter s.tensor, gradient
// at grad + s.offset, state slot k at state + k * stride + s.offset. Defined in
// ddp/cuda/elementwise.cuh; DDP_CUDA_OPTIMIZER(Optimizer) instantiates it for one optimizer in an
// nvcc translation unit (ddp's own does so for sgd and adamw).
template <int S, class Rule>
cudaError_t elementwise(const segment* params, std::size_t count, const float* grad, float* state,
                        std::size_t stride, Rule rule, launch_limits, cudaStream_t);

}  // namespace ddp::cuda::kernels
