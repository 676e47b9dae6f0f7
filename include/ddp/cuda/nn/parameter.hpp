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
      : name_(std::move(name)), shape_(std::move(shape)), value_(device_vector<float>::from_host(dev, initial)),
        own_grad_(device_vector<float>::zeros(dev, initial.size())), grad_(own_grad_.data()) {}
  parameter(parameter&&) noexcept = default;
  parameter& operator=(parameter&&) noexcept = default;

  float* value() noexcept { return value_.data(); }
  const float* value() const noexcept { return value_.data(); }
  float* grad() noexcept { return grad_; }
  std::size_t size() const noexcept { return value_.size(); }
  const std::string& name() const noexcept { return name_; }

  // The gradient lives at `storage` (GPU memory of a trainer's bucket) from now on.
  void bind_gradient(float* storage) {
    if (storage != grad_) value_.device().copy(storage, grad_, size() * sizeof(float));
    grad_ = storage;
    own_grad_ = {};
  }

  parameter_ref ref(const std::string& prefix) const {
    const auto where = device_id::cuda(value_.device().ordinal());
    return {prefix + name_, tensor_ref{const_cast<float*>(value_.data()), dtype::f32, shape_, where},
            tensor_ref{grad_, dtype::f32, shape_, where}};
  }

 private:
  std::string name_;
  shape_t shape_;
  device_vector<float> value_;
  device_vector<float> own_grad_;
  float* grad_;
};

template <class T>
class buffer {
 public:
  buffer(cuda::device& dev, std::string name, std::size_t n, T fill)
      : name_(std::move(name)), data_(device_vector<T>::from_host(dev, std::vector<T>(n, fill))) {}
  T* data() noexcept { return data_.data(); }
  const T* data() const noexcept { return data_.data(); }
  std::vector<T> to_host() const { return data_.to_host(); }
  buffer_version& version() noexcept { return version_; }

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
