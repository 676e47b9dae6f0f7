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
#include <vector>

#include "ddp/cuda/kernels.hpp"
#include "ddp/cuda/segment_table.hpp"

namespace ddp::cuda::kernels {

namespace device_code {

constexpr int threads = 256;

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

__device__ __forceinline__ std::size_t first_thread() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_threads() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

// vec(i) handles floats [4i, 4i+4) when `vectorized`, one(i) the single float i.
template <class Vec, class One>
__device__ __forceinline__ void grid_stride(std::size_t n, bool vectorized, Vec vec, One one) {
  std::size_t tail = 0;
  if (vectorized) {
    const std::size_t n4 = n / 4;
    for (std::size_t i = first_thread(); i < n4; i += grid_threads()) vec(i);
    tail = n4 * 4;
  }
  for (std::size_t i = tail + first_thread(); i < n; i += grid_threads()) one(i);
}

// This thread's groups of the table (ddp/cuda/segment_table.hpp): f(segment, span) for each.
template <class F>
__device__ __forceinline__ void over_groups(const segment_table& t, F f) {
  for_each_group(t, first_thread(), grid_threads(), [&](group_span g) { f(t.s[g.index], g); });
}

template <class F>
__device__ __forceinline__ float4 map4(float4 a, F f) {
  return {f(a.x), f(a.y), f(a.z), f(a.w)};
}

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

// Four elements moved as one load and one store: 16 bytes of floats, 8 of halves.
template <class T>
struct alignas(4 * sizeof(T)) quad {
  T v[4];
};

template <class From, class To>
__global__ void cast_kernel(const From* src, To* dst, std::size_t n) {
  const bool vectorized = (reinterpret_cast<std::uintptr_t>(src) % sizeof(quad<From>)) == 0 &&
                          (reinterpret_cast<std::uintptr_t>(dst) % sizeof(quad<To>)) == 0;
  grid_stride(
      n, vectorized,
      [&](std::size_t i) {
        const quad<From> in = reinterpret_cast<const quad<From>*>(src)[i];
        quad<To> out;
#pragma unroll
        for (int k = 0; k < 4; ++k) out.v[k] = convert<From, To>(in.v[k]);
        reinterpret_cast<quad<To>*>(dst)[i] = out;
      },
      [&](std::size_t i) { dst[i] = convert<From, To>(src[i]); });
}

struct sgd_args {
  float lr, momentum, weight_decay;
  bool nesterov;
};

__device__ __forceinline__ void sgd_one(float& p, float g, float& m, const sgd_args& o) {
  const float d = g + o.weight_decay * p;
  m = o.momentum * m + d;
  p -= o.lr * (o.nesterov ? d + o.momentum * m : m);
}
__device__ __forceinline__ void sgd_plain(float& p, float g, const sgd_args& o) { p -= o.lr * (g + o.weight_decay * p); }

// Momentum 0 neither reads nor writes the momentum state (as the host kernel).
__global__ void sgd_kernel(const __grid_constant__ segment_table t, const float* grad, float* momentum, sgd_args o) {
  const bool with_momentum = o.momentum != 0.0f;
  over_groups(t, [&](const segment& s, group_span gs) {
    float* p = s.tensor + gs.begin;
    const float* g = grad + s.offset + gs.begin;
    float* m = momentum + s.offset + gs.begin;
    if (gs.full() && aligned16(p) && aligned16(g) && aligned16(m)) {
      float4 p4 = *reinterpret_cast<float4*>(p);
      const float4 g4 = *reinterpret_cast<const float4*>(g);
      if (with_momentum) {
        float4 m4 = *reinterpret_cast<float4*>(m);
        sgd_one(p4.x, g4.x, m4.x, o);
        sgd_one(p4.y, g4.y, m4.y, o);
        sgd_one(p4.z, g4.z, m4.z, o);
        sgd_one(p4.w, g4.w, m4.w, o);
        *reinterpret_cast<float4*>(m) = m4;
      } else {
        sgd_plain(p4.x, g4.x, o);
        sgd_plain(p4.y, g4.y, o);
        sgd_plain(p4.z, g4.z, o);
        sgd_plain(p4.w, g4.w, o);
      }
      *reinterpret_cast<float4*>(p) = p4;
    } else {
      for (std::size_t i = 0; i < gs.end - gs.begin; ++i) {
        if (with_momentum)
          sgd_one(p[i], g[i], m[i], o);
        else
          sgd_plain(p[i], g[i], o);
      }
    }
  });
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

__global__ void adamw_kernel(const __grid_constant__ segment_table t, const float* grad, float* m_all, float* v_all,
                             adamw_args o) {
  over_groups(t, [&](const segment& s, group_span gs) {
    float* p = s.tensor + gs.begin;
    const float* g = grad + s.offset + gs.begin;
    float* m = m_all + s.offset + gs.begin;
    float* v = v_all + s.offset + gs.begin;
    if (gs.full() && aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v)) {
      float4 p4 = *reinterpret_cast<float4*>(p);
      const float4 g4 = *reinterpret_cast<const float4*>(g);
      float4 m4 = *reinterpret_cast<float4*>(m);
      float4 v4 = *reinterpret_cast<float4*>(v);
      adamw_one(p4.x, g4.x, m4.x, v4.x, o);
      adamw_one(p4.y, g4.y, m4.y, v4.y, o);
      adamw_one(p4.z, g4.z, m4.z, v4.z, o);
      adamw_one(p4.w, g4.w, m4.w, v4.w, o);
      *reinterpret_cast<float4*>(p) = p4;
      *reinterpret_cast<float4*>(m) = m4;
      *reinterpret_cast<float4*>(v) = v4;
    } else {
      for (std::size_t i = 0; i < gs.end - gs.begin; ++i) adamw_one(p[i], g[i], m[i], v[i], o);
    }
  });
}

// Enough blocks for one group (4 floats) per thread, at most the device's limit.
inline unsigned blocks_for_groups(std::size_t groups, launch_limits limits) {
  const std::size_t wanted = (groups + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<std::size_t>(wanted, 1, static_cast<std::size_t>(limits.max_blocks)));
}
inline unsigned blocks_for(std::size_t n, launch_limits limits) { return blocks_for_groups((n + 3) / 4, limits); }

// Launches kernel(table, args...) over `segments`, segment_table::capacity at a time.
template <class Kernel, class... Args>
cudaError_t over_segments(const segment* segments, std::size_t count, launch_limits limits, cudaStream_t stream,
                          Kernel kernel, Args... args) {
  for (std::size_t begin = 0; begin < count; begin += segment_table::capacity) {
    const segment_table t = segment_table::of(segments + begin, count - begin);
    if (t.groups() == 0) continue;
    kernel<<<blocks_for_groups(t.groups(), limits), threads, 0, stream>>>(t, args...);
  }
  return cudaGetLastError();
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
