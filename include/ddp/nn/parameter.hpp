#pragma once
// Storage of one layer's parameter and buffer, with the views the module concept hands out.
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/core/buffer_version.hpp"
#include "ddp/core/tensor.hpp"

namespace ddp::nn {

class parameter {
 public:
  parameter(std::string name, shape_t shape)
      : name_(std::move(name)), shape_(std::move(shape)), numel_(count(shape_)), own_value_(numel_),
        own_grad_(numel_), value_(own_value_.data()), grad_(own_grad_.data()) {}
  // Moving keeps value_ and grad_ valid: the vectors' heap storage moves with them.
  parameter(parameter&&) noexcept = default;
  parameter& operator=(parameter&&) noexcept = default;

  std::span<float> value() noexcept { return {value_, numel_}; }
  std::span<const float> value() const noexcept { return {value_, numel_}; }
  std::span<float> grad() noexcept { return {grad_, numel_}; }
  std::span<const float> grad() const noexcept { return {grad_, numel_}; }
  const std::string& name() const noexcept { return name_; }

  // The gradient lives at `storage` from now on (bucket memory of a trainer); nullptr: back in
  // the parameter's own storage.
  void bind_gradient(float* storage) { bind(storage, grad_, own_grad_); }
  // The value lives at `storage` from now on (a trainer's gathered parameters, update::sharded);
  // nullptr: back in the parameter's own storage.
  void bind_value(float* storage) { bind(storage, value_, own_value_); }

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
  // Moves the current contents to `storage` and points `where` at it; nullptr moves them back
  // into storage of this parameter's own (a trainer gives its buckets back).
  void bind(float* storage, float*& where, std::vector<float>& own) {
    if (!storage) {
      if (own.empty()) {
        own.assign(where, where + numel_);
        where = own.data();
      }
      return;
    }
    if (storage != where) std::memcpy(storage, where, numel_ * sizeof(float));
    where = storage;
    own.clear();
    own.shrink_to_fit();
  }
  std::string name_;
  shape_t shape_;
  std::size_t numel_;
  std::vector<float> own_value_;
  std::vector<float> own_grad_;
  float* value_;
  float* grad_;
};

template <class T>
class buffer {
 public:
  buffer(std::string name, std::size_t n, T fill = T{})
      : buffer(std::move(name), shape_t{static_cast<std::int64_t>(n)}, fill) {}
  // An N-dimensional buffer (a running covariance, a count per class and step, ...): its shape
  // travels in the buffer_ref, so the P5 signature compares it across ranks.
  buffer(std::string name, shape_t shape, T fill = T{})
      : name_(std::move(name)), shape_(std::move(shape)), data_(numel_of(shape_), fill) {}

  // The buffer owns its version (pitfall P1): every write goes through write(), which bumps it,
  // so a backward that reads the buffer after a write since its forward is caught.
  std::span<const T> read() const noexcept { return data_; }
  std::span<T> write() noexcept {
    version_.bump();
    return data_;
  }
  // In forward, when backward will read the buffer: read it and record its version ...
  std::span<const T> read_for_backward() {
    version_.save_for_backward();
    return data_;
  }
  // ... and in backward, once read: release that record (innermost first).
  void release_after_backward() { version_.release_saved(); }
  const buffer_version& version() const noexcept { return version_; }

  buffer_ref ref(const std::string& prefix) {
    return {prefix + name_, make_tensor_ref(std::span<T>(data_), shape_), &version_};
  }
  const shape_t& shape() const noexcept { return shape_; }

 private:
  static std::size_t numel_of(const shape_t& shape) {
    std::size_t n = 1;
    for (const auto d : shape) {
      if (d < 0) throw std::invalid_argument("ddp::nn::buffer: a dimension is negative");
      n *= static_cast<std::size_t>(d);
    }
    return n;
  }

  std::string name_;
  shape_t shape_;
  std::vector<T> data_;
  buffer_version version_;
};

}  // namespace ddp::nn
