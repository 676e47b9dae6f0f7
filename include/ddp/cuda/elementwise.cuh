#pragma once
// The CUDA kernel that runs an optimizer's element rule over a bucket (declared in
// ddp/cuda/kernels.hpp). nvcc only. One instantiation per optimizer:
//   #include <ddp/cuda/elementwise.cuh>
//   DDP_CUDA_OPTIMIZER(my::lion)   // at namespace scope, in one .cu file of the program
// ddp's own translation unit instantiates it for ddp::optim::sgd and ddp::optim::adamw.
#include "ddp/cuda/grid.cuh"
#include "ddp/cuda/kernels.hpp"
#include "ddp/optim/optimizer.hpp"

namespace ddp::cuda::kernels {

namespace device_code {

// Four elements per thread with 16-byte loads when the segment's group is whole and aligned
// (as the other bucket kernels), else one at a time.
template <int S, class Rule>
__global__ void elementwise_kernel(const __grid_constant__ segment_table t, const float* grad, float* state,
                                   std::size_t stride, Rule rule) {
  over_groups(t, [&](const segment& s, group_span gs) {
    float* p = s.tensor + gs.begin;
    const float* g = grad + s.offset + gs.begin;
    float* st = state + s.offset + gs.begin;
    bool vectorized = gs.full() && aligned16(p) && aligned16(g);
#pragma unroll
    for (int k = 0; k < S; ++k) vectorized = vectorized && aligned16(st + k * stride);
    if (vectorized) {
      float4 p4 = *reinterpret_cast<float4*>(p);
      const float4 g4 = *reinterpret_cast<const float4*>(g);
      float4 s4[S > 0 ? S : 1];
#pragma unroll
      for (int k = 0; k < S; ++k) s4[k] = *reinterpret_cast<const float4*>(st + k * stride);
      float* pv = &p4.x;
      const float* gv = &g4.x;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float one[S > 0 ? S : 1];
#pragma unroll
        for (int k = 0; k < S; ++k) one[k] = (&s4[k].x)[e];
        rule(pv[e], gv[e], one);
#pragma unroll
        for (int k = 0; k < S; ++k) (&s4[k].x)[e] = one[k];
      }
      *reinterpret_cast<float4*>(p) = p4;
#pragma unroll
      for (int k = 0; k < S; ++k) *reinterpret_cast<float4*>(st + k * stride) = s4[k];
    } else {
      for (std::size_t i = 0; i < gs.end - gs.begin; ++i) {
        float one[S > 0 ? S : 1];
#pragma unroll
        for (int k = 0; k < S; ++k) one[k] = st[k * stride + i];
        rule(p[i], g[i], one);
#pragma unroll
        for (int k = 0; k < S; ++k) st[k * stride + i] = one[k];
      }
    }
  });
}

}  // namespace device_code

template <int S, class Rule>
cudaError_t elementwise(const segment* params, std::size_t count, const float* grad, float* state,
                        std::size_t stride, Rule rule, launch_limits limits, cudaStream_t stream) {
  return device_code::over_segments(params, count, limits, stream, device_code::elementwise_kernel<S, Rule>, grad,
                                    state, stride, rule);
}

}  // namespace ddp::cuda::kernels

#define DDP_CUDA_OPTIMIZER(...)                                                                       \
  template cudaError_t ddp::cuda::kernels::elementwise<__VA_ARGS__::state_slots,                      \
                                                       ddp::optim::rule_of<__VA_ARGS__>>(             \
      const ddp::segment*, std::size_t, const float*, float*, std::size_t, ddp::optim::rule_of<__VA_ARGS__>, \
      ddp::cuda::kernels::launch_limits, cudaStream_t)
