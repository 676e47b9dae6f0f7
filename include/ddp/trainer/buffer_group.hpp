#pragma once
// Buffers that travel in one collective: staged back to back in one device array, so a model
// with many small buffers (running statistics, counters) pays one collective per step instead
// of one per buffer — each collective is a point where ranks wait for each other.
#include <cstddef>
#include <vector>

#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"
#include "ddp/core/tensor.hpp"

namespace ddp::detail {

template <device D>
class buffer_group {
 public:
  buffer_group(D& dev, dtype element) : device_(&dev), element_(element) {}

  // `t`'s bytes join the group; `element` must divide them (u8 groups take any dtype).
  void add(const tensor_ref& t) {
    members_.push_back(t);
    bytes_ += t.bytes();
  }
  bool empty() const noexcept { return members_.empty(); }
  const std::vector<tensor_ref>& members() const noexcept { return members_; }

  // collective(mutable_buffer) runs once over every member.
  template <class Collective>
  void apply(Collective&& collective) {
    if (members_.empty()) return;
    if (!staging_.data()) staging_ = device_array<D, std::byte>(*device_, bytes_);
    std::size_t offset = 0;
    for (const auto& m : members_) device_->copy(staging_.data() + offset, m.data, m.bytes()), offset += m.bytes();
    collective(mutable_buffer{staging_.data(), bytes_ / size_of(element_), element_});
    offset = 0;
    for (const auto& m : members_) device_->copy(m.data, staging_.data() + offset, m.bytes()), offset += m.bytes();
  }

 private:
  D* device_;
  dtype element_;
  std::vector<tensor_ref> members_;
  std::size_t bytes_ = 0;
  device_array<D, std::byte> staging_;
};

}  // namespace ddp::detail
