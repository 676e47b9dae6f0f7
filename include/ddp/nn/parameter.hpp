#pragma once
// Storage of one layer's parameter and buffer, with the views the module concept hands out.
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "ddp/core/buffer_version.hpp"
#include "ddp/core/tensor.hpp"

namespace ddp::nn {

class parameter {
 public:
  parameter(std::string name, shape_t shape)
      : name_(std::move(name)), shape_(std::move(shape)), value_(count(shape_)), own_grad_(value_.size()),
        grad_(own_grad_.data()) {}
  // Moving keeps grad_ valid: the vectors' heap storage moves with them.
  parameter(parameter&&) noexcept = default;
  parameter& operator=(parameter&&) noexcept = default;

  std::span<float> value() noexcept { return value_; }
  std::span<const float> value() const noexcept { return value_; }
  std::span<float> grad() noexcept { return {grad_, value_.size()}; }
  std::span<const float> grad() const noexcept { return {grad_, value_.size()}; }
  const std::string& name() const noexcept { return name_; }

  // The gradient lives at `storage` from now on (bucket memory of a trainer).
  void bind_gradient(float* storage) {
    if (storage != grad_) std::memcpy(storage, grad_, value_.size() * sizeof(float));
    grad_ = storage;
    own_grad_.clear();
    own_grad_.shrink_to_fit();
  }

  parameter_ref ref(const std::string& prefix) const {
    auto* self = const_cast<parameter*>(this);
    return {prefix + name_, make_tensor_ref(self->value(), shape_), make_tensor_ref(self->grad(), shape_)};
  }

 private:
  static std::size_t count(const shape_t& s) {
    std::size_t n = 1;
    for (auto d : s) n *= static_cast<std::size_t>(d);
    return n;
  }
  std::string name_;
  shape_t shape_;
  std::vector<float> value_;
  std::vector<float> own_grad_;
  float* grad_;
};

template <class T>
class buffer {
 public:
  buffer(std::string name, std::size_t n, T fill = T{}) : name_(std::move(name)), data_(n, fill) {}
  std::span<T> data() noexcept { return data_; }
  std::span<const T> data() const noexcept { return data_; }
  buffer_version& version() noexcept { return version_; }
  const buffer_version& version() const noexcept { return version_; }

  buffer_ref ref(const std::string& prefix) {
    return {prefix + name_, make_tensor_ref(std::span<T>(data_), {static_cast<std::int64_t>(data_.size())}),
            &version_};
  }

 private:
  std::string name_;
  std::vector<T> data_;
  buffer_version version_;
};

}  // namespace ddp::nn
