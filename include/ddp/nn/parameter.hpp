#pragma once
// Storage of one layer's parameter and buffer, with the views the module concept hands out.
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/core/buffer_version.hpp"
#include "ddp/core/tensor.hpp"
#include "ddp/host/half.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::nn {

// A parameter is f32 unless cast to bf16 or f16: then the module holds it, and its gradient, in
// 16 bits (what the trainer sees and keeps an f32 master copy of), and the layers compute in f32
// from a widened copy: before_forward() widens the value, after_backward() adds the gradient
// the layer accumulated in f32 into the 16-bit gradient, rounding once per backward.
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
  // The gradient is at `storage` as it is there, nothing copied; nullptr: nowhere (its own memory
  // goes too) until placed again (update::sharded_gradients, layer by layer in backward).
  void place_gradient(float* storage) { place(storage, grad_, own_grad_, "gradient"); }
  // The value is at `storage` as it is there, nothing copied; nullptr: nowhere (its own memory
  // goes too) until placed again (update::fully_sharded, layer by layer in forward and backward).
  void place_value(float* storage) { place(storage, value_, own_value_, "value"); }

  parameter_ref ref(const std::string& prefix) const;

  dtype type() const noexcept { return type_; }
  // Keeps the parameter in `t` (f32, bf16 or f16) from now on: the value rounded to nearest even,
  // the gradient too. Before a trainer is built over the module.
  void cast(dtype t);
  // 16 bits: value() is the stored value, widened (the layer's forward reads it).
  void before_forward() {
    if (type_ != dtype::f32) widen(half_value_, own_value_);
  }
  // 16 bits: the gradient the layer's backward accumulated into grad() goes into the stored one.
  void after_backward();

 private:
  static std::size_t count(const shape_t& s) {
    std::size_t n = 1;
    for (auto d : s) n *= static_cast<std::size_t>(d);
    return n;
  }
  // Moves the current contents to `storage` and points `where` at it; nullptr moves them back
  // into storage of this parameter's own (a trainer gives its buckets back).
  void bind(float* storage, float*& where, std::vector<float>& own);
  // Points `where` at `storage` and lets the parameter's own memory go.
  void place(float* storage, float*& where, std::vector<float>& own, const char* what);
  void widen(const std::vector<std::uint16_t>& from, std::vector<float>& to) const;
  void narrow(const std::vector<float>& from, std::vector<std::uint16_t>& to) const;

  std::string name_;
  shape_t shape_;
  std::size_t numel_;
  std::vector<float> own_value_;  // f32: the value; 16 bits: the widened copy the layer reads
  std::vector<float> own_grad_;   // f32: the gradient; 16 bits: the layer's f32 accumulation of one backward
  float* value_;
  float* grad_;
  dtype type_ = dtype::f32;
  std::vector<std::uint16_t> half_value_;  // 16 bits: the stored value and gradient
  std::vector<std::uint16_t> half_grad_;
};

template <class T>
class buffer {
 public:
  buffer(std::string name, std::size_t n, T fill = T{})
      : buffer(std::move(name), shape_t{static_cast<std::int64_t>(n)}, fill) {}
  // An N-dimensional buffer (a running covariance, a count per class and step, ...): its shape
  // travels in the buffer_ref, so the same-model signature compares it across ranks.
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

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE parameter_ref parameter::ref(const std::string& prefix) const {
  auto* self = const_cast<parameter*>(this);
  if (type_ != dtype::f32)
    return {prefix + name_, tensor_ref{self->half_value_.data(), type_, shape_},
            tensor_ref{self->half_grad_.data(), type_, shape_}};
  return {prefix + name_, make_tensor_ref(self->value(), shape_), make_tensor_ref(self->grad(), shape_)};
}

DDP_RUNTIME_INLINE void parameter::cast(dtype t) {
  if (t != dtype::f32 && !is_half(t))
    throw std::invalid_argument("ddp::nn::parameter '" + name_ + "': cast to " + std::string(name_of(t)) +
                                "; a parameter is f32, bf16 or f16");
  if (value_ != own_value_.data() || grad_ != own_grad_.data())
    throw std::logic_error("ddp::nn::parameter '" + name_ + "': cast while a trainer holds its storage; cast the "
                           "module before building the trainer");
  if (type_ != dtype::f32) {  // back to f32 first: the working copies hold the 16-bit values widened
    before_forward();
    widen(half_grad_, own_grad_);
  }
  type_ = t;
  if (t == dtype::f32) {
    half_value_.clear(), half_grad_.clear();
    return;
  }
  half_value_.resize(numel_), half_grad_.resize(numel_);
  narrow(own_value_, half_value_);
  narrow(own_grad_, half_grad_);
  before_forward();
  std::fill(own_grad_.begin(), own_grad_.end(), 0.0f);
}

DDP_RUNTIME_INLINE void parameter::after_backward() {
  if (type_ == dtype::f32) return;
  host::visit_half_dtype(type_, [&]<class F>(F) {
    for (std::size_t i = 0; i < numel_; ++i) half_grad_[i] = F::to(F::from(half_grad_[i]) + own_grad_[i]);
  });
  std::fill(own_grad_.begin(), own_grad_.end(), 0.0f);
}

DDP_RUNTIME_INLINE void parameter::bind(float* storage, float*& where, std::vector<float>& own) {
  if (type_ != dtype::f32)
    throw std::logic_error("ddp::nn::parameter '" + name_ + "' is " + std::string(name_of(type_)) +
                           ": only f32 storage can be bound");
  if (!storage) {
    if (own.empty()) {
      if (where) own.assign(where, where + numel_);
      else own.assign(numel_, 0.0f);  // placed nowhere: no gradient held
      where = own.data();
    }
    return;
  }
  if (!where) {  // placed nowhere: a zero gradient
    std::fill(storage, storage + numel_, 0.0f);
    where = storage;
    return;
  }
  if (storage != where) std::memcpy(storage, where, numel_ * sizeof(float));
  where = storage;
  own.clear();
  own.shrink_to_fit();
}

DDP_RUNTIME_INLINE void parameter::place(float* storage, float*& where, std::vector<float>& own, const char* what) {
  if (type_ != dtype::f32)
    throw std::logic_error("ddp::nn::parameter '" + name_ + "' is " + std::string(name_of(type_)) + ": only an f32 " +
                           what + " can be placed");
  where = storage;
  own.clear();
  own.shrink_to_fit();
}

DDP_RUNTIME_INLINE void parameter::widen(const std::vector<std::uint16_t>& from, std::vector<float>& to) const {
  host::visit_half_dtype(type_, [&]<class F>(F) { host::widen<F>(from.data(), to.data(), numel_); });
}

DDP_RUNTIME_INLINE void parameter::narrow(const std::vector<float>& from, std::vector<std::uint16_t>& to) const {
  host::visit_half_dtype(type_, [&]<class F>(F) { host::narrow<F>(from.data(), to.data(), numel_, 1.0f); });
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::nn
