#pragma once
// The launch shape every ddp kernel shares: grid-stride loops over floats or over a bucket's
// segments (segment_table), 16-byte moves when the pointers allow. Templates and inline
// functions only, so any number of nvcc translation units may include it (kernels.cuh,
// elementwise.cuh in a user's .cu). nvcc only.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "ddp/cuda/kernels.hpp"
#include "ddp/cuda/segment_table.hpp"

namespace ddp::cuda::kernels::device_code {

inline constexpr int threads = 256;

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

// Blocks of `threads` that `kernel` keeps resident on one multiprocessor (its registers and shared
// memory decide: AdamW's rule, with more registers than a copy, fits fewer), asked once per kernel.
template <class Kernel>
int resident_blocks_per_multiprocessor(Kernel kernel) {
  static std::mutex mutex;
  static std::unordered_map<const void*, int> known;
  const auto* key = reinterpret_cast<const void*>(kernel);
  std::lock_guard lock(mutex);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0) != cudaSuccess || blocks < 1) {
    (void)cudaGetLastError();  // the launch that follows reports a real problem
    blocks = 1;
  }
  return known[key] = blocks;
}

// Enough blocks for one group (4 floats) per thread, at most one wave of `kernel` on the device.
template <class Kernel>
unsigned blocks_for_groups(std::size_t groups, launch_limits limits, Kernel kernel) {
  const std::size_t wanted = (groups + threads - 1) / threads;
  const auto wave = static_cast<std::size_t>(resident_blocks_per_multiprocessor(kernel)) *
                    static_cast<std::size_t>(std::max(limits.multiprocessors, 1));
  return static_cast<unsigned>(std::clamp<std::size_t>(wanted, 1, wave));
}
template <class Kernel>
unsigned blocks_for(std::size_t n, launch_limits limits, Kernel kernel) {
  return blocks_for_groups((n + 3) / 4, limits, kernel);
}

// Launches kernel(table, args...) over `segments`, segment_table::capacity at a time.
template <class Kernel, class... Args>
cudaError_t over_segments(const segment* segments, std::size_t count, launch_limits limits, cudaStream_t stream,
                          Kernel kernel, Args... args) {
  for (std::size_t begin = 0; begin < count; begin += segment_table::capacity) {
    const segment_table t = segment_table::of(segments + begin, count - begin);
    if (t.groups() == 0) continue;
    kernel<<<blocks_for_groups(t.groups(), limits, kernel), threads, 0, stream>>>(t, args...);
  }
  return cudaGetLastError();
}

}  // namespace ddp::cuda::kernels::device_code
