#pragma once
// The host device: tensors in CPU memory, kernels run at once on the calling thread.
#include <atomic>
#include <cstdlib>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

#include "ddp/concepts/device.hpp"
#include "ddp/core/error.hpp"
#include "ddp/host/kernels.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::host {

class device {
 public:
  static constexpr device_kind kind = device_kind::cpu;
  static constexpr std::size_t alignment = 64;

  device() = default;
  // A copy is another handle on the host: its memory meter starts at zero.
  device(const device&) noexcept {}
  device& operator=(const device&) noexcept { return *this; }

  device_id id() const noexcept { return device_id::cpu(); }

  void* allocate(std::size_t bytes);
  void deallocate(void* p, std::size_t bytes) noexcept {
    if (!p) return;
    std::free(p);
    in_use_.fetch_sub(bytes, std::memory_order_relaxed);
  }

  // The bytes allocated through this device and not yet freed (a trainer's buckets, gathered
  // parameters, optimizer state: what it holds besides the module's own storage), and the most
  // there were at once since construction or the last reset.
  std::size_t memory_in_use() const noexcept { return in_use_.load(std::memory_order_relaxed); }
  std::size_t memory_high_water() const noexcept { return high_water_.load(std::memory_order_relaxed); }
  void reset_memory_high_water() noexcept { high_water_.store(memory_in_use(), std::memory_order_relaxed); }

  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes && dst != src) std::memcpy(dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* src, std::size_t bytes) { copy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) { copy(dst, src, bytes); }
  void fill_zero(void* dst, std::size_t bytes) {
    if (bytes) std::memset(dst, 0, bytes);
  }

  void scale(float* x, std::size_t n, float factor) { host::scale(x, n, factor); }
  double sum_of_squares(const float* x, std::size_t n) { return host::sum_of_squares(x, n); }
  void pack(std::span<const segment> s, float* bucket) { host::pack(s, bucket); }
  void unpack(std::span<const segment> s, const float* bucket) { host::unpack(s, bucket); }

  void cast(const_buffer src, mutable_buffer dst) { cast(src, dst, 1.0f); }
  // dst = src * factor, f32 -> f16 / bf16 (the product rounded once more to 16 bits); factor 1
  // only the other way.
  void cast(const_buffer src, mutable_buffer dst, float factor);

  // An optimizer's element rule over a bucket (ddp/optim/optimizer.hpp).
  template <int S, class Rule>
  void elementwise(std::span<const segment> p, const float* g, float* state, std::size_t stride, const Rule& rule) {
    host::elementwise<S>(p, g, state, stride, rule);
  }

  void synchronize() noexcept {}
  // Host memory carries no attributes to read; the module's declared device is taken as is.
  std::optional<device_id> locate(const void*) const noexcept { return std::nullopt; }

 private:
  std::atomic<std::size_t> in_use_{0};
  std::atomic<std::size_t> high_water_{0};
};

static_assert(diagnose_device<device>());

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE void* device::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
  if (!p)
    throw error("host", "allocate", -1,
                "out of memory allocating " + std::to_string(bytes) + " bytes");
  const std::size_t now = in_use_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  for (std::size_t seen = high_water_.load(std::memory_order_relaxed);
       seen < now && !high_water_.compare_exchange_weak(seen, now, std::memory_order_relaxed);) {
  }
  return p;
}

DDP_RUNTIME_INLINE void device::cast(const_buffer src, mutable_buffer dst, float factor) {
  if (src.count != dst.count)
    throw error("host", "cast", -1,
                "source has " + std::to_string(src.count) + " elements but destination " +
                    std::to_string(dst.count));
  const auto n = src.count;
  if (src.type == dtype::f32 && is_half(dst.type)) {
    visit_half_dtype(dst.type, [&]<class F>(F) {
      narrow<F>(static_cast<const float*>(src.data), static_cast<std::uint16_t*>(dst.data), n, factor);
    });
  } else if (is_half(src.type) && dst.type == dtype::f32 && factor == 1.0f) {
    visit_half_dtype(src.type, [&]<class F>(F) {
      widen<F>(static_cast<const std::uint16_t*>(src.data), static_cast<float*>(dst.data), n);
    });
  } else if (src.type == dst.type && factor == 1.0f) {
    copy(dst.data, src.data, src.bytes());
  } else {
    throw error("host", "cast", -1,
                "no conversion from " + std::string(name_of(src.type)) + " to " +
                    std::string(name_of(dst.type)) + (factor == 1.0f ? "" : " with a factor") +
                    "; cast supports f32 <-> f16 / bf16, and a factor only from f32");
  }
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::host
