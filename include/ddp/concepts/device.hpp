#pragma once
// The device concept: where tensors live and how the trainer's small kernels run there.
//
// Work is queued on the device's compute queue in call order (a CUDA stream; the host device
// runs it at once). Pointers are device memory unless a name says host.
//
//   static constexpr ddp::device_kind kind;  ddp::device_id id() const;
//   void* allocate(std::size_t bytes);  void deallocate(void*, std::size_t bytes);
//   void copy(void* dst, const void* src, std::size_t bytes);            device to device
//   void copy_from_host(void* dst, const void* host_src, std::size_t bytes);
//   void copy_to_host(void* host_dst, const void* src, std::size_t bytes);  returns when done
//   void fill_zero(void* dst, std::size_t bytes);
//   void scale(float* x, std::size_t n, float factor);
//   double sum_of_squares(const float* x, std::size_t n);   returns when done; the same bits on
//                                                           every run (gradient clipping's norm)
//   void pack(std::span<const segment>, float* bucket);       bucket[offset..] = *tensor
//   void unpack(std::span<const segment>, const float* bucket);  *tensor = bucket[offset..]
//   void cast(ddp::const_buffer src, ddp::mutable_buffer dst);  f32 <-> f16 / bf16, same count
//   template <int S, class Rule>
//   void elementwise(std::span<const segment> params, const float* grad, float* state,
//                    std::size_t stride, const Rule&);
//        an optimizer's element rule (ddp/optim/optimizer.hpp) over every parameter element:
//        rule(p, grad[offset + i], s) with s[k] at state[k * stride + offset + i], k < S
//   void synchronize();                                   host waits for the queue to drain
//   std::optional<ddp::device_id> locate(const void*) const;  where memory really lives, when
//                                                        the device can tell (the same-device check)
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "ddp/core/buffer.hpp"
#include "ddp/core/device_id.hpp"
#include "ddp/core/segment.hpp"

namespace ddp {

namespace device_requirements {

template <class D>
concept has_identity = requires(const D& d) {
  { D::kind } -> std::convertible_to<device_kind>;
  { d.id() } -> std::same_as<device_id>;
};
template <class D>
concept has_memory = requires(D& d, void* p, const void* cp, std::size_t n) {
  { d.allocate(n) } -> std::same_as<void*>;
  d.deallocate(p, n);
  d.copy(p, cp, n);
  d.copy_from_host(p, cp, n);
  d.copy_to_host(p, cp, n);
  d.fill_zero(p, n);
};
template <class D>
concept has_bucket_kernels =
    requires(D& d, float* x, const float* cx, std::size_t n, std::span<const segment> segs,
             const_buffer src, mutable_buffer dst) {
      d.scale(x, n, 1.0f);
      { d.sum_of_squares(cx, n) } -> std::convertible_to<double>;
      d.pack(segs, x);
      d.unpack(segs, cx);
      d.cast(src, dst);
    };
// A rule of the shape optimizers use, to check that the device runs one.
struct probe_rule {
  void operator()(float&, float, float*) const {}
};
template <class D>
concept has_elementwise = requires(D& d, std::span<const segment> segs, const float* g, float* s, std::size_t n) {
  d.template elementwise<2>(segs, g, s, n, probe_rule{});
};
template <class D>
concept has_queue = requires(D& d, const D& cd, const void* p) {
  d.synchronize();
  { cd.locate(p) } -> std::same_as<std::optional<device_id>>;
};

}  // namespace device_requirements

template <class D>
concept device = device_requirements::has_identity<D> && device_requirements::has_memory<D> &&
                 device_requirements::has_bucket_kernels<D> &&
                 device_requirements::has_elementwise<D> && device_requirements::has_queue<D>;

template <class D>
consteval bool diagnose_device() {
  namespace r = device_requirements;
  static_assert(r::has_identity<D>,
                "ddp: the device lacks `static constexpr ddp::device_kind kind` or "
                "`ddp::device_id id() const`");
  static_assert(r::has_memory<D>,
                "ddp: the device lacks one of allocate, deallocate, copy, copy_from_host, "
                "copy_to_host, fill_zero (see ddp/concepts/device.hpp)");
  static_assert(r::has_bucket_kernels<D>,
                "ddp: the device lacks one of the bucket kernels scale, sum_of_squares, pack, unpack, cast");
  static_assert(r::has_elementwise<D>,
                "ddp: the device lacks `template <int S, class Rule> void elementwise(std::span<const "
                "ddp::segment>, const float* grad, float* state, std::size_t stride, const Rule&)` (runs an "
                "optimizer's element rule)");
  static_assert(r::has_queue<D>,
                "ddp: the device lacks `synchronize()` or `std::optional<ddp::device_id> "
                "locate(const void*) const`");
  return device<D>;
}

}  // namespace ddp
