#pragma once
// Storage of one layer's parameter and buffer in GPU memory, with the views the module concept
// hands out (tensor_refs that say which GPU they are on, for the P3 check).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ddp/core/buffer_version.hpp"
#include "ddp/core/tensor.hpp"
#include "ddp/cuda/device_vector.hpp"

namespace ddp::cuda::nn {

class parameter {
 public:
  // `initial` holds the value (host memory); the gradient starts at zero.
  parameter(cuda::device& dev, std::string name, shape_t shape, std::span<const float> initial)
      : name_(std::move(name)), shape_(std::move(shape)), dev_(&dev), numel_(initial.size()),
        own_value_(device_vector<float>::from_host(dev, initial)),
        own_grad_(device_vector<float>::zeros(dev, initial.size())), value_(own_value_.data()),
        grad_(own_grad_.data()) {}
  parameter(parameter&&) noexcept = default;
  parameter& operator=(parameter&&) noexcept = default;

  float* value() noexcept { return value_; }
  const float* value() const noexcept { return value_; }
  float* grad() noexcept { return grad_; }
  std::size_t size() const noexcept { return numel_; }
  const std::string& name() const noexcept { return name_; }

  // The gradient lives at `storage` (GPU memory of a trainer's bucket) from now on.
  void bind_gradient(float* storage) { bind(storage, grad_, own_grad_); }
  // The value lives at `storage` (a trainer's gathered parameters, update::sharded) from now on.
  void bind_value(float* storage) { bind(storage, value_, own_value_); }

  parameter_ref ref(const std::string& prefix) const {
    const auto where = device_id::cuda(dev_->ordinal());
    return {prefix + name_, tensor_ref{value_, dtype::f32, shape_, where},
            tensor_ref{grad_, dtype::f32, shape_, where}};
  }

 private:
  // Moves the current contents to `storage` (queued on the device's stream) and points `where` at it.
  // nullptr moves them back into storage of this parameter's own (a trainer gives its buckets back).
  void bind(float* storage, float*& where, device_vector<float>& own) {
    if (!storage) {
      if (own.size() == 0 && numel_ > 0) {
        own = device_vector<float>(*dev_, numel_);
        dev_->copy(own.data(), where, numel_ * sizeof(float));
        where = own.data();
      }
      return;
    }
    if (storage != where) dev_->copy(storage, where, numel_ * sizeof(float));
    where = storage;
    own = {};
  }
  std::string name_;
  shape_t shape_;
  cuda::device* dev_;
  std::size_t numel_;
  device_vector<float> own_value_;
  device_vector<float> own_grad_;
  float* value_;
  float* grad_;
};

template <class T>
class buffer {
 public:
  buffer(cuda::device& dev, std::string name, std::size_t n, T fill)
      : name_(std::move(name)), data_(device_vector<T>::from_host(dev, std::vector<T>(n, fill))) {}
  // As ddp::nn::buffer: the buffer owns its version (pitfall P1); every write goes through
  // write(), which bumps it.
  const T* read() const noexcept { return data_.data(); }
  T* write() noexcept {
    version_.bump();
    return data_.data();
  }
  // In forward, when backward will read the buffer; release once backward has read it.
  const T* read_for_backward() {
    version_.save_for_backward();
    return data_.data();
  }
  void release_after_backward() { version_.release_saved(); }
  const buffer_version& version() const noexcept { return version_; }
  std::vector<T> to_host() const { return data_.to_host(); }

  buffer_ref ref(const std::string& prefix) {
    return {prefix + name_,
            tensor_ref{data_.data(), dtype_of<T>, {static_cast<std::int64_t>(data_.size())},
                       device_id::cuda(data_.device().ordinal())},
            &version_};
  }

 private:
  std::string name_;
  device_vector<T> data_;
  buffer_version version_;
};

}  // namespace ddp::cuda::nn
