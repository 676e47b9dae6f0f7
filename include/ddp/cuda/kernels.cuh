#pragma once
// Definitions of ddp/cuda/kernels.hpp. Compile in exactly one nvcc translation unit (ddp::cuda's
// src/cuda/kernels.cu does); keep range-v3 and the trainer out of it.
//
// Every kernel is a grid-stride loop that moves 16 bytes per load when its pointers allow
// (bucket offsets are multiples of 4 floats, allocations 256-byte aligned), else 4.
// Segment lists travel as kernel arguments, up to segments_per_launch per launch, one
// blockIdx.y each: no upload, no synchronisation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ddp/cuda/kernels.hpp"

namespace ddp::cuda::kernels {

namespace device_code {

constexpr int threads = 256;
constexpr std::size_t segments_per_launch = 128;  // 3 KiB of arguments, under the 4 KiB limit

struct segment_list {
  segment s[segments_per_launch];
};

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

// vec(i) handles floats [4i, 4i+4) when `vectorized`, one(i) the single float i.
template <class Vec, class One>
__device__ __forceinline__ void grid_stride(std::size_t n, bool vectorized, Vec vec, One one) {
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t tail = 0;
  if (vectorized) {
    const std::size_t n4 = n / 4;
    for (std::size_t i = first; i < n4; i += stride) vec(i);
    tail = n4 * 4;
  }
  for (std::size_t i = tail + first; i < n; i += stride) one(i);
}

template <class F>
__device__ __forceinline__ float4 map4(float4 a, F f) {
  return {f(a.x), f(a.y), f(a.z), f(a.w)};
}

__global__ void copy_segments_kernel(segment_list list, float* bucket, bool pack) {
  const segment s = list.s[blockIdx.y];
  float* dst = pack ? bucket + s.offset : s.tensor;
  const float* src = pack ? s.tensor : bucket + s.offset;
  if (dst == src) return;
  grid_stride(
      s.count, aligned16(dst) && aligned16(src),
      [&](std::size_t i) { reinterpret_cast<float4*>(dst)[i] = reinterpret_cast<const float4*>(src)[i]; },
      [&](std::size_t i) { dst[i] = src[i]; });
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

template <class From, class To>
__device__ __forceinline__ To convert(From v);
template <> __device__ __forceinline__ __half convert<float, __half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 convert<float, __nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ float convert<__half, float>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float convert<__nv_bfloat16, float>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <class From, class To>
__global__ void cast_kernel(const From* src, To* dst, std::size_t n) {
  // Four elements per step: 16 bytes of floats against 8 of halves.
  const bool vectorized = (reinterpret_cast<std::uintptr_t>(src) % (4 * sizeof(From))) == 0 &&
                          (reinterpret_cast<std::uintptr_t>(dst) % (4 * sizeof(To))) == 0;
  grid_stride(
      n, vectorized,
      [&](std::size_t i) {
        To out[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) out[k] = convert<From, To>(src[4 * i + k]);
#pragma unroll
        for (int k = 0; k < 4; ++k) dst[4 * i + k] = out[k];
      },
      [&](std::size_t i) { dst[i] = convert<From, To>(src[i]); });
}

struct sgd_args {
  float lr, momentum, weight_decay;
  bool nesterov;
};

__device__ __forceinline__ void sgd_one(float& p, float g, float& m, const sgd_args& o) {
  const float d = g + o.weight_decay * p;
  if (o.momentum == 0.0f) {
    p -= o.lr * d;
    return;
  }
  m = o.momentum * m + d;
  p -= o.lr * (o.nesterov ? d + o.momentum * m : m);
}

__global__ void sgd_kernel(segment_list list, const float* grad, float* momentum, sgd_args o) {
  const segment s = list.s[blockIdx.y];
  float* p = s.tensor;
  const float* g = grad + s.offset;
  float* m = momentum + s.offset;
  grid_stride(
      s.count, aligned16(p) && aligned16(g) && aligned16(m),
      [&](std::size_t i) {
        float4 p4 = reinterpret_cast<float4*>(p)[i];
        const float4 g4 = reinterpret_cast<const float4*>(g)[i];
        float4 m4 = reinterpret_cast<float4*>(m)[i];
        sgd_one(p4.x, g4.x, m4.x, o);
        sgd_one(p4.y, g4.y, m4.y, o);
        sgd_one(p4.z, g4.z, m4.z, o);
        sgd_one(p4.w, g4.w, m4.w, o);
        reinterpret_cast<float4*>(p)[i] = p4;
        if (o.momentum != 0.0f) reinterpret_cast<float4*>(m)[i] = m4;
      },
      [&](std::size_t i) { sgd_one(p[i], g[i], m[i], o); });
}

struct adamw_args {
  float beta1, beta2, eps, decay, step_size, inv_sqrt_bc2;
};

__device__ __forceinline__ void adamw_one(float& p, float g, float& m, float& v, const adamw_args& o) {
  p *= o.decay;
  m = o.beta1 * m + (1.0f - o.beta1) * g;
  v = o.beta2 * v + (1.0f - o.beta2) * g * g;
  p -= o.step_size * m / (sqrtf(v) * o.inv_sqrt_bc2 + o.eps);
}

__global__ void adamw_kernel(segment_list list, const float* grad, float* m_all, float* v_all, adamw_args o) {
  const segment s = list.s[blockIdx.y];
  float* p = s.tensor;
  const float* g = grad + s.offset;
  float* m = m_all + s.offset;
  float* v = v_all + s.offset;
  grid_stride(
      s.count, aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v),
      [&](std::size_t i) {
        float4 p4 = reinterpret_cast<float4*>(p)[i];
        const float4 g4 = reinterpret_cast<const float4*>(g)[i];
        float4 m4 = reinterpret_cast<float4*>(m)[i];
        float4 v4 = reinterpret_cast<float4*>(v)[i];
        adamw_one(p4.x, g4.x, m4.x, v4.x, o);
        adamw_one(p4.y, g4.y, m4.y, v4.y, o);
        adamw_one(p4.z, g4.z, m4.z, v4.z, o);
        adamw_one(p4.w, g4.w, m4.w, v4.w, o);
        reinterpret_cast<float4*>(p)[i] = p4;
        reinterpret_cast<float4*>(m)[i] = m4;
        reinterpret_cast<float4*>(v)[i] = v4;
      },
      [&](std::size_t i) { adamw_one(p[i], g[i], m[i], v[i], o); });
}

inline unsigned blocks_for(std::size_t n, launch_limits limits) {
  const std::size_t wanted = (n / 4 + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<std::size_t>(wanted, 1, static_cast<std::size_t>(limits.max_blocks)));
}

// Launches kernel(list, args...) over `segments` in groups of segments_per_launch.
template <class Kernel, class... Args>
cudaError_t over_segments(const segment* segments, std::size_t count, launch_limits limits, cudaStream_t stream,
                          Kernel kernel, Args... args) {
  for (std::size_t begin = 0; begin < count; begin += segments_per_launch) {
    const std::size_t n = std::min(segments_per_launch, count - begin);
    segment_list list{};
    std::size_t longest = 0;
    for (std::size_t k = 0; k < n; ++k) {
      list.s[k] = segments[begin + k];
      longest = std::max(longest, segments[begin + k].count);
    }
    if (longest == 0) continue;
    // Blocks per segment shrink as segments grow in number, so one launch stays a few waves.
    const std::size_t per_segment = std::max<std::size_t>(1, static_cast<std::size_t>(limits.max_blocks) / n);
    const dim3 grid(static_cast<unsigned>(std::min<std::size_t>(blocks_for(longest, limits), per_segment)),
                    static_cast<unsigned>(n));
    kernel<<<grid, threads, 0, stream>>>(list, args...);
  }
  return cudaGetLastError();
}

}  // namespace device_code

cudaError_t copy_segments(const segment* segments, std::size_t count, float* bucket, direction d,
                          launch_limits limits, cudaStream_t stream) {
  return device_code::over_segments(segments, count, limits, stream, device_code::copy_segments_kernel, bucket,
                                    d == direction::pack);
}

cudaError_t scale(float* x, std::size_t n, float factor, launch_limits limits, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  device_code::scale_kernel<<<device_code::blocks_for(n, limits), device_code::threads, 0, stream>>>(x, n, factor);
  return cudaGetLastError();
}

bool cast(const void* src, dtype from, void* dst, dtype to, std::size_t n, launch_limits limits,
          cudaStream_t stream, cudaError_t& status) {
  using namespace device_code;
  status = cudaSuccess;
  if (n == 0) return true;
  const unsigned blocks = blocks_for(n, limits);
  if (from == dtype::f32 && to == dtype::f16)
    cast_kernel<<<blocks, threads, 0, stream>>>(static_cast<const float*>(src), static_cast<__half*>(dst), n);
  else if (from == dtype::f32 && to == dtype::bf16)
    cast_kernel<<<blocks, threads, 0, stream>>>(static_cast<const float*>(src), static_cast<__nv_bfloat16*>(dst), n);
  else if (from == dtype::f16 && to == dtype::f32)
    cast_kernel<<<blocks, threads, 0, stream>>>(static_cast<const __half*>(src), static_cast<float*>(dst), n);
  else if (from == dtype::bf16 && to == dtype::f32)
    cast_kernel<<<blocks, threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(src), static_cast<float*>(dst), n);
  else
    return false;
  status = cudaGetLastError();
  return true;
}

cudaError_t sgd_update(const segment* params, std::size_t count, const float* grad, float* momentum,
                       const optim::sgd& o, launch_limits limits, cudaStream_t stream) {
  return device_code::over_segments(params, count, limits, stream, device_code::sgd_kernel, grad, momentum,
                                    device_code::sgd_args{o.lr, o.momentum, o.weight_decay, o.nesterov});
}

cudaError_t adamw_update(const segment* params, std::size_t count, const float* grad, float* m, float* v,
                         const optim::adamw& o, std::int64_t step, launch_limits limits, cudaStream_t stream) {
  // Step-dependent factors once on the host, as the host kernel computes them.
  const float bc1 = 1.0f - std::pow(o.beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(o.beta2, static_cast<float>(step));
  const device_code::adamw_args args{o.beta1, o.beta2, o.eps, 1.0f - o.lr * o.weight_decay, o.lr / bc1,
                                     1.0f / std::sqrt(bc2)};
  return device_code::over_segments(params, count, limits, stream, device_code::adamw_kernel, grad, m, v, args);
}

}  // namespace ddp::cuda::kernels
