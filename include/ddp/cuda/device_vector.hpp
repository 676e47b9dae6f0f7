#pragma once
// An owning array in one GPU's memory, allocated and freed in order on the device's compute
// stream (cudaMallocAsync), so the per-step temporaries of the reference layers cost no
// synchronisation. Copies are deep, queued on the same stream.
#include <cuda_runtime.h>

#include <span>
#include <utility>
#include <vector>

#include "ddp/cuda/device.hpp"

namespace ddp::cuda {

template <class T>
class device_vector {
 public:
  device_vector() = default;
  device_vector(cuda::device& dev, std::size_t n) : dev_(&dev), size_(n) {
    if (n == 0) return;
    dev.activate();
    check(cudaMallocAsync(reinterpret_cast<void**>(&data_), n * sizeof(T), dev.stream()), "cudaMallocAsync", dev.site());
  }
  static device_vector zeros(cuda::device& dev, std::size_t n) {
    device_vector v(dev, n);
    dev.fill_zero(v.data_, n * sizeof(T));
    return v;
  }
  static device_vector from_host(cuda::device& dev, std::span<const T> host) {
    device_vector v(dev, host.size());
    dev.copy_from_host(v.data_, host.data(), host.size_bytes());
    return v;
  }

  device_vector(const device_vector& o) : device_vector(o.dev_ ? device_vector(*o.dev_, o.size_) : device_vector()) {
    if (size_) dev_->copy(data_, o.data_, size_ * sizeof(T));
  }
  device_vector(device_vector&& o) noexcept
      : dev_(o.dev_), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  device_vector& operator=(device_vector o) noexcept {
    std::swap(dev_, o.dev_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~device_vector() {
    if (data_) cudaFreeAsync(data_, dev_->stream());
  }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  cuda::device& device() const noexcept { return *dev_; }

  // Waits for the stream.
  std::vector<T> to_host() const {
    std::vector<T> out(size_);
    if (size_) dev_->copy_to_host(out.data(), data_, size_ * sizeof(T));
    return out;
  }

 private:
  cuda::device* dev_ = nullptr;
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace ddp::cuda
