#pragma once
// The memory of buckets that hold their gradients or gathered parameters only while needed
// (update::sharded_gradients, update::fully_sharded): arrays kept across steps, each given to a
// bucket it fits (the smallest that does), made at the bucket's own size when none does. The
// pool settles in the first steps, after which a step allocates nothing, and a large layer does
// not make every array large.
#include <cstddef>
#include <utility>
#include <vector>

#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"

namespace ddp::detail {

template <device Device>
class memory_pool {
 public:
  using array = device_array<Device, float>;

  explicit memory_pool(Device& dev) : device_(dev) {}
  // Holds references and state that others point into: neither copied nor moved.
  memory_pool(const memory_pool&) = delete;
  memory_pool& operator=(const memory_pool&) = delete;

  // The smallest spare array that holds `floats`; else a new one of that size, which replaces the
  // largest spare (too small) so that the pool never holds more arrays than were in use at once.
  // Arrays are only replaced by larger ones and added, so the pool settles in the first steps.
  array take(std::size_t floats) {
    if (spare_.empty()) return array(device_, floats);
    auto best = spare_.end(), largest = spare_.begin();
    for (auto it = spare_.begin(); it != spare_.end(); ++it) {
      if (it->size() >= floats && (best == spare_.end() || it->size() < best->size())) best = it;
      if (it->size() > largest->size()) largest = it;
    }
    if (best == spare_.end()) {
      spare_.erase(largest);  // freed before the new one is made: the high-water mark is the pool's
      return array(device_, floats);
    }
    auto memory = std::move(*best);
    spare_.erase(best);
    return memory;
  }
  // An array no bucket holds now, kept for the next take().
  void give(array memory) { spare_.push_back(std::move(memory)); }

  // The spare arrays' bytes.
  std::size_t bytes() const noexcept {
    std::size_t floats = 0;
    for (const auto& a : spare_) floats += a.size();
    return floats * sizeof(float);
  }

 private:
  Device& device_;
  std::vector<array> spare_;
};

}  // namespace ddp::detail
