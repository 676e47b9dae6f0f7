#pragma once
// A bucket as its communication hook sees it (comm_hook::bucket_io_on<Device>), for one call of
// the hook: the gradients, the bucket's shape and tensors, scratch and kept state, and the
// collectives, which the bucket tracks as its own. The gradients' all_reduce carries the control
// floats when the control channel routed them there (control_route::with_gradients).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"
#include "ddp/core/buffer.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/reduce_op.hpp"
#include "ddp/policy/comm_hook.hpp"
#include "ddp/trainer/control_route.hpp"

namespace ddp::detail {

template <communicator Comm, device Device>
class bucket;

template <communicator Comm, device Device>
class bucket_hook_io final : public comm_hook::bucket_io_on<Device> {
 public:
  // The hook's call in step `step`. `held`: a sync's reduction held across steps (a streaming
  // fragment in flight), whose hook works on the caller's memory and sees the step it began in
  // when it finishes.
  bucket_hook_io(bucket<Comm, Device>& owner, std::uint64_t step, float* held = nullptr)
      : b(owner), step_(step), held_(held) {}
  bool carried_control = false;  // the gradients' all_reduce carried them, as routed

  Device& device() noexcept override { return *b.device_; }
  std::size_t index() const noexcept override { return b.index(); }
  std::uint64_t step() const noexcept override { return step_; }
  int rank() const noexcept override { return b.comm_->rank(); }
  int ranks() const noexcept override { return b.comm_->size(); }
  float* gradients() noexcept override { return held_ ? held_ : b.grads_.data(); }
  std::size_t size() const noexcept override { return b.padded(); }
  std::size_t shard_begin() const noexcept override { return b.scatters_ ? b.shard_begin() : 0; }
  std::size_t shard() const noexcept override { return b.scatters_ ? b.shard() : b.padded(); }
  std::span<const comm_hook::tensor_layout> tensors() const noexcept override { return b.tensors_; }
  void* scratch(int slot, std::size_t bytes) override { return kept(b.hook_scratch_, slot, bytes).data; }
  comm_hook::hook_state state(int slot, std::size_t bytes) override { return kept(b.hook_state_, slot, bytes); }
  void cast(const_buffer from, mutable_buffer to, float factor) override {
    if constexpr (requires { b.device_->cast(from, to, factor); }) {
      b.device_->cast(from, to, factor);
    } else {  // a device without the fused form: the source (this bucket's gradients) is scaled in place
      if (factor != 1.0f) b.device_->scale(static_cast<float*>(const_cast<void*>(from.data)), from.count, factor);
      b.device_->cast(from, to);
    }
  }
  void reduce_gradients() override {
    if (b.exact_) return reduce_like_gradients(b.exact_->start(b.grads_.data()), reduce_op::sum);
    float* g = gradients();
    if (b.scatters_) return reduce_like_gradients(mutable_buffer{g, b.padded(), dtype::f32}, reduce_op::avg);
    // Routed with the gradients, the control floats ride in this all_reduce: one collective.
    const bool carries = b.control_route_ == control_route::with_gradients && !held_;
    const std::size_t n = b.padded() + (carries ? b.shape_.control : 0);
    b.track(b.comm_->all_reduce(const_buffer{g, n, dtype::f32}, mutable_buffer{g, n, dtype::f32}, reduce_op::avg));
    carried_control = carries;
  }
  void reduce_like_gradients(mutable_buffer x, reduce_op op) override {
    if (x.count != b.padded())
      throw error("comm_hook", "reduce_like_gradients", b.comm_->rank(),
                  "bucket " + std::to_string(b.index()) + " has " + std::to_string(b.padded()) +
                      " gradient elements, but the buffer given has " + std::to_string(x.count) +
                      "; give one laid out as gradients(), of size() elements");
    if (b.scatters_) {
      auto* shard = static_cast<char*>(x.data) + b.shard_begin() * size_of(x.type);
      b.track(b.comm_->reduce_scatter(const_buffer{x.data, b.padded(), x.type},
                                      mutable_buffer{shard, b.shard(), x.type}, op));
    } else {
      b.track(b.comm_->all_reduce(const_buffer{x.data, b.padded(), x.type}, mutable_buffer{x.data, b.padded(), x.type}, op));
    }
  }
  void all_reduce(const_buffer send, mutable_buffer recv, reduce_op op) override {
    b.track(b.comm_->all_reduce(send, recv, op));
  }
  void all_gather(const_buffer send, mutable_buffer recv) override { b.track(b.comm_->all_gather(send, recv)); }
  void wait() override {
    b.works_.wait_reduction();
  }

 private:
  // Slot `slot` of `arrays` at `bytes` (rounded up to floats): made and zeroed when new or resized.
  comm_hook::hook_state kept(std::vector<device_array<Device, float>>& arrays, int slot, std::size_t bytes) {
    if (slot < 0) throw error("comm_hook", "scratch", b.comm_->rank(), "slot " + std::to_string(slot) + " is negative");
    const auto k = static_cast<std::size_t>(slot);
    if (arrays.size() <= k) arrays.resize(k + 1);
    auto& a = arrays[k];
    const std::size_t floats = (bytes + sizeof(float) - 1) / sizeof(float);
    if (a.size() == floats) return {a.data(), false};
    a = zeroed_array<float>(*b.device_, floats);
    return {a.data(), true};
  }

  bucket<Comm, Device>& b;
  std::uint64_t step_;
  float* held_;  // a held sync's memory, else none
};

}  // namespace ddp::detail
