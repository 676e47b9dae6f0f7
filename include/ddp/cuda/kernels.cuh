#pragma once
// Definitions of ddp/cuda/kernels.hpp. Compile in exactly one nvcc translation unit (ddp::cuda's
// src/cuda/kernels.cu does); keep range-v3 and the trainer out of it.
//
// Every kernel is a grid-stride loop that moves 16 bytes per load when its pointers allow
// (bucket offsets are multiples of 4 floats, allocations 256-byte aligned), else 4.
// Segment lists travel as kernel arguments (segment_table, up to its capacity per launch): no
// upload, no synchronisation; all threads share every segment's work evenly.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ddp/cuda/grid.cuh"
#include "ddp/cuda/kernels.hpp"
#include "ddp/cuda/segment_table.hpp"

namespace ddp::cuda::kernels {

namespace device_code {

// The table is read in place from the launch's parameter memory (__grid_constant__): it is
// indexed with a run-time segment number, which would otherwise copy it per thread.
__global__ void copy_segments_kernel(const __grid_constant__ segment_table t, float* bucket, bool pack) {
  over_groups(t, [&](const segment& s, group_span g) {
    float* dst = (pack ? bucket + s.offset : s.tensor) + g.begin;
    const float* src = (pack ? s.tensor : bucket + s.offset) + g.begin;
    if (g.full() && aligned16(dst) && aligned16(src)) {
      *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(src);
    } else {
      for (std::size_t i = 0; i < g.end - g.begin; ++i) dst[i] = src[i];
    }
  });
}

__global__ void scale_kernel(float* x, std::size_t n, float factor) {
  grid_stride(
      n, aligned16(x),
      [&](std::size_t i) {
        auto* x4 = reinterpret_cast<float4*>(x);
        x4[i] = map4(x4[i], [&](float v) { return v * factor; });
      },
      [&](std::size_t i) { x[i] *= factor; });
}

// The casts give the host's bits (ddp/host/half.hpp), NaNs included. Numbers go through CUDA's
// round-to-nearest-even conversions. NaNs follow the host's rule, written out here: a quiet NaN of
// the same sign keeping as much of the payload as the target holds (its top bits when narrowing,
// zeros appended when widening). CUDA's own conversions would write the canonical NaN (0x7FFF
// for f16 and bf16, 0x7FFFFFFF for f32), dropping sign and payload.
__device__ __forceinline__ bool is_nan_bits(unsigned u) { return (u & 0x7fffffffu) > 0x7f800000u; }

template <class From, class To>
__device__ __forceinline__ To convert(From v);
template <> __device__ __forceinline__ __half convert<float, __half>(float v) {
  const unsigned u = __float_as_uint(v);
  if (is_nan_bits(u))
    return __ushort_as_half(static_cast<unsigned short>(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu)));
  return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 convert<float, __nv_bfloat16>(float v) {
  const unsigned u = __float_as_uint(v);
  if (is_nan_bits(u)) return __ushort_as_bfloat16(static_cast<unsigned short>((u >> 16) | 0x40u));
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ float convert<__half, float>(__half v) {
  const unsigned h = __half_as_ushort(v);
  if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0)
    return __uint_as_float(((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13));
  return __half2float(v);
}
// bf16 is f32's upper half: widening is exact as a shift, a NaN quieted.
template <> __device__ __forceinline__ float convert<__nv_bfloat16, float>(__nv_bfloat16 v) {
  const unsigned u = static_cast<unsigned>(__bfloat16_as_ushort(v)) << 16;
  return __uint_as_float(is_nan_bits(u) ? (u | 0x400000u) : u);
}

// Four elements moved as one load and one store: 16 bytes of floats, 8 of halves.
template <class T>
struct alignas(4 * sizeof(T)) quad {
  T v[4];
};

// Sums of squares in a fixed order: each thread its grid-stride elements, then a tree over the
// block's threads in shared memory.
__device__ __forceinline__ double block_sum(double v) {
  __shared__ double lane[threads];
  lane[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = threads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) lane[threadIdx.x] += lane[threadIdx.x + half];
    __syncthreads();
  }
  return lane[0];
}

__global__ void sum_of_squares_kernel(const float* x, std::size_t n, double* partials) {
  double s = 0.0;
  for (std::size_t i = first_thread(); i < n; i += grid_threads()) s += static_cast<double>(x[i]) * x[i];
  const double block = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = block;
}

__global__ void sum_partials_kernel(const double* partials, unsigned count, double* result) {
  double s = 0.0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  const double total = block_sum(s);
  if (threadIdx.x == 0) *result = total;
}

__global__ void orthonormalize_columns_kernel(float* a, std::size_t rows, std::size_t cols, float eps) {
  // Each thread reads and writes its own rows; block_sum shares the sums (and the __syncthreads
  // after each keeps its shared memory from being overwritten while a thread still reads it).
  for (std::size_t j = 0; j < cols; ++j) {
    double squares = 0.0;
    for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x) squares += static_cast<double>(a[i * cols + j]) * a[i * cols + j];
    const float inverse = 1.0f / (static_cast<float>(sqrt(block_sum(squares))) + eps);
    __syncthreads();
    for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x) a[i * cols + j] *= inverse;
    for (std::size_t k = j + 1; k < cols; ++k) {
      double dot = 0.0;
      for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x) dot += static_cast<double>(a[i * cols + j]) * a[i * cols + k];
      const auto d = static_cast<float>(block_sum(dot));
      __syncthreads();
      for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x) a[i * cols + k] -= d * a[i * cols + j];
    }
  }
}

// x * factor for f32 sources (the product rounded in f32, then converted); other sources as they are.
// A NaN is passed through unmultiplied: the GPU's multiply would return the canonical NaN, where
// the host's (x86, and ARM by default) keeps the NaN operand's sign and payload, so the cast of a
// NaN is the cast of the NaN itself on both, whatever the factor.
template <class From>
__device__ From premultiplied(From x, float factor) {
  if constexpr (std::is_same_v<From, float>) return is_nan_bits(__float_as_uint(x)) ? x : x * factor;
  else return x;
}

template <class From, class To>
__global__ void cast_kernel(const From* src, To* dst, std::size_t n, float factor) {
  const bool vectorized = (reinterpret_cast<std::uintptr_t>(src) % sizeof(quad<From>)) == 0 &&
                          (reinterpret_cast<std::uintptr_t>(dst) % sizeof(quad<To>)) == 0;
  grid_stride(
      n, vectorized,
      [&](std::size_t i) {
        const quad<From> in = reinterpret_cast<const quad<From>*>(src)[i];
        quad<To> out;
#pragma unroll
        for (int k = 0; k < 4; ++k) out.v[k] = convert<From, To>(premultiplied(in.v[k], factor));
        reinterpret_cast<quad<To>*>(dst)[i] = out;
      },
      [&](std::size_t i) { dst[i] = convert<From, To>(premultiplied(src[i], factor)); });
}

}  // namespace device_code

cudaError_t copy_segments(const segment* segments, std::size_t count, float* bucket, direction d,
                          launch_limits limits, cudaStream_t stream) {
  // A tensor that already lives at its place in the bucket (bound gradients) has nothing to copy.
  std::vector<segment> moving;
  moving.reserve(count);
  for (std::size_t k = 0; k < count; ++k)
    if (segments[k].tensor != bucket + segments[k].offset && segments[k].count) moving.push_back(segments[k]);
  return device_code::over_segments(moving.data(), moving.size(), limits, stream, device_code::copy_segments_kernel,
                                    bucket, d == direction::pack);
}

cudaError_t scale(float* x, std::size_t n, float factor, launch_limits limits, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  device_code::scale_kernel<<<device_code::blocks_for(n, limits, device_code::scale_kernel), device_code::threads, 0,
                              stream>>>(x, n, factor);
  return cudaGetLastError();
}

cudaError_t sum_of_squares(const float* x, std::size_t n, double* partials, double* result, cudaStream_t stream) {
  using namespace device_code;
  const unsigned blocks = static_cast<unsigned>(
      std::clamp<std::size_t>((n + threads - 1) / threads, 1, sum_of_squares_blocks));
  sum_of_squares_kernel<<<blocks, threads, 0, stream>>>(x, n, partials);
  sum_partials_kernel<<<1, threads, 0, stream>>>(partials, blocks, result);
  return cudaGetLastError();
}

cudaError_t orthonormalize_columns(float* a, std::size_t rows, std::size_t cols, float eps, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  device_code::orthonormalize_columns_kernel<<<1, device_code::threads, 0, stream>>>(a, rows, cols, eps);
  return cudaGetLastError();
}

bool cast(const void* src, dtype from, void* dst, dtype to, std::size_t n, float factor, launch_limits limits,
          cudaStream_t stream, cudaError_t& status) {
  using namespace device_code;
  status = cudaSuccess;
  if (n == 0) return true;
  // Each conversion's grid from its own kernel's occupancy.
  auto launch = [&]<class From, class To>(const From* in, To* out) {
    cast_kernel<<<blocks_for(n, limits, cast_kernel<From, To>), threads, 0, stream>>>(in, out, n, factor);
  };
  if (from == dtype::f32 && to == dtype::f16)
    launch(static_cast<const float*>(src), static_cast<__half*>(dst));
  else if (from == dtype::f32 && to == dtype::bf16)
    launch(static_cast<const float*>(src), static_cast<__nv_bfloat16*>(dst));
  else if (from == dtype::f16 && to == dtype::f32)
    launch(static_cast<const __half*>(src), static_cast<float*>(dst));
  else if (from == dtype::bf16 && to == dtype::f32)
    launch(static_cast<const __nv_bfloat16*>(src), static_cast<float*>(dst));
  else
    return false;
  status = cudaGetLastError();
  return true;
}

}  // namespace ddp::cuda::kernels
