#pragma once
// Owning array of T in a device's memory.
#include <cstddef>
#include <utility>

#include "ddp/concepts/device.hpp"

namespace ddp {

template <device D, class T>
class device_array {
 public:
  device_array() = default;
  device_array(D& dev, std::size_t count)
      : device_(&dev), data_(static_cast<T*>(dev.allocate(count * sizeof(T)))), count_(count) {}
  device_array(device_array&& o) noexcept
      : device_(o.device_), data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  device_array& operator=(device_array&& o) noexcept {
    if (this != &o) {
      release();
      device_ = o.device_;
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  ~device_array() { release(); }

  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }

 private:
  void release() noexcept {
    if (data_) device_->deallocate(data_, count_ * sizeof(T));
    data_ = nullptr;
  }
  D* device_ = nullptr;
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

// `count` zeros of T in the device's memory.
template <class T, device D>
device_array<D, T> zeroed_array(D& dev, std::size_t count) {
  device_array<D, T> a(dev, count);
  dev.fill_zero(a.data(), count * sizeof(T));
  return a;
}

}  // namespace ddp
