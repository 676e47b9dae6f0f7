#pragma once
// Storage of one layer's parameter and buffer in GPU memory, with the views the module concept
// hands out (tensor_refs that say which GPU they are on, for the same-device check).
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/core/buffer_version.hpp"
#include "ddp/core/tensor.hpp"
#include "ddp/cuda/check.hpp"
#include "ddp/cuda/device_vector.hpp"
#include "ddp/nn/cuda/kernels.hpp"

namespace ddp::nn::cuda {

// As ddp::nn::parameter: f32 unless cast to bf16 or f16, when the module holds value and gradient
// in 16 bits and the layers compute in f32 from a widened copy (before_forward), their gradient
// added into the 16-bit one once per backward (after_backward).
class parameter {
 public:
  // `initial` holds the value (host memory); the gradient starts at zero.
  parameter(ddp::cuda::device& dev, std::string name, shape_t shape, std::span<const float> initial)
      : name_(std::move(name)), shape_(std::move(shape)), dev_(&dev), numel_(initial.size()),
        own_value_(ddp::cuda::device_vector<float>::from_host(dev, initial)),
        own_grad_(ddp::cuda::device_vector<float>::zeros(dev, initial.size())), value_(own_value_.data()),
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
  // The gradient is at `storage` as it is there, nothing copied; nullptr: nowhere (its own memory
  // goes too) until placed again (update::sharded_gradients, layer by layer in backward).
  void place_gradient(float* storage) { place(storage, grad_, own_grad_, "gradient"); }
  // The value is at `storage` as it is there, nothing copied; nullptr: nowhere (update::
  // fully_sharded, layer by layer in forward and backward).
  void place_value(float* storage) { place(storage, value_, own_value_, "value"); }

  parameter_ref ref(const std::string& prefix) const {
    const auto where = device_id::cuda(dev_->ordinal());
    if (type_ != dtype::f32)
      return {prefix + name_, tensor_ref{const_cast<std::uint16_t*>(half_value_.data()), type_, shape_, where},
              tensor_ref{const_cast<std::uint16_t*>(half_grad_.data()), type_, shape_, where}};
    return {prefix + name_, tensor_ref{value_, dtype::f32, shape_, where},
            tensor_ref{grad_, dtype::f32, shape_, where}};
  }

  dtype type() const noexcept { return type_; }
  // Keeps the parameter in `t` (f32, bf16 or f16) from now on, value and gradient rounded to
  // nearest even. Before a trainer is built over the module.
  void cast(dtype t) {
    if (t != dtype::f32 && !is_half(t))
      throw std::invalid_argument("ddp::nn::cuda::parameter '" + name_ + "': cast to " + std::string(name_of(t)) +
                                  "; a parameter is f32, bf16 or f16");
    if (value_ != own_value_.data() || grad_ != own_grad_.data())
      throw std::logic_error("ddp::nn::cuda::parameter '" + name_ + "': cast while a trainer holds its storage; cast "
                             "the module before building the trainer");
    if (type_ != dtype::f32) {
      before_forward();
      dev_->cast(const_buffer{half_grad_.data(), numel_, type_}, mutable_buffer{grad_, numel_, dtype::f32});
    }
    type_ = t;
    if (t == dtype::f32) {
      half_value_ = {}, half_grad_ = {};
      return;
    }
    half_value_ = ddp::cuda::device_vector<std::uint16_t>(*dev_, numel_);
    half_grad_ = ddp::cuda::device_vector<std::uint16_t>(*dev_, numel_);
    dev_->cast(const_buffer{value_, numel_, dtype::f32}, mutable_buffer{half_value_.data(), numel_, t});
    dev_->cast(const_buffer{grad_, numel_, dtype::f32}, mutable_buffer{half_grad_.data(), numel_, t});
    dev_->fill_zero(grad_, numel_ * sizeof(float));
    before_forward();
  }
  void before_forward() {
    if (type_ != dtype::f32)
      dev_->cast(const_buffer{half_value_.data(), numel_, type_}, mutable_buffer{value_, numel_, dtype::f32});
  }
  void after_backward() {
    if (type_ != dtype::f32)
      ddp::cuda::check(kernels::add_into_half(half_grad_.data(), type_ == dtype::bf16, grad_, numel_, dev_->stream()),
                       "add_into_half kernel", dev_->site());
  }

 private:
  // Points `where` at `storage` and lets the parameter's own memory go.
  void place(float* storage, float*& where, ddp::cuda::device_vector<float>& own, const char* what) {
    if (type_ != dtype::f32)
      throw std::logic_error("ddp::nn::cuda::parameter '" + name_ + "' is " + std::string(name_of(type_)) +
                             ": only an f32 " + what + " can be placed");
    where = storage;
    own = {};
  }
  // Moves the current contents to `storage` (queued on the device's stream) and points `where` at it.
  // nullptr moves them back into storage of this parameter's own (a trainer gives its buckets back).
  void bind(float* storage, float*& where, ddp::cuda::device_vector<float>& own) {
    if (type_ != dtype::f32)
      throw std::logic_error("ddp::nn::cuda::parameter '" + name_ + "' is " + std::string(name_of(type_)) +
                             ": only f32 storage can be bound");
    if (!storage) {
      if (own.size() == 0 && numel_ > 0) {
        own = ddp::cuda::device_vector<float>(*dev_, numel_);
        if (where) dev_->copy(own.data(), where, numel_ * sizeof(float));
        else dev_->fill_zero(own.data(), numel_ * sizeof(float));  // placed nowhere: no gradient held
        where = own.data();
      }
      return;
    }
    if (!where) dev_->fill_zero(storage, numel_ * sizeof(float));
    else if (storage != where) dev_->copy(storage, where, numel_ * sizeof(float));
    where = storage;
    own = {};
  }
  std::string name_;
  shape_t shape_;
  ddp::cuda::device* dev_;
  std::size_t numel_;
  ddp::cuda::device_vector<float> own_value_;
  ddp::cuda::device_vector<float> own_grad_;
  float* value_;  // f32: the value; 16 bits: the widened copy the layer reads
  float* grad_;   // f32: the gradient; 16 bits: the layer's f32 accumulation of one backward
  dtype type_ = dtype::f32;
  ddp::cuda::device_vector<std::uint16_t> half_value_;  // 16 bits: the stored value and gradient
  ddp::cuda::device_vector<std::uint16_t> half_grad_;
};

template <class T>
class buffer {
 public:
  buffer(ddp::cuda::device& dev, std::string name, std::size_t n, T fill)
      : name_(std::move(name)), data_(ddp::cuda::device_vector<T>::from_host(dev, std::vector<T>(n, fill))) {}
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
  ddp::cuda::device_vector<T> data_;
  buffer_version version_;
};

}  // namespace ddp::nn::cuda
