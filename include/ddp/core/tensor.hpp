#pragma once
// Non-owning, type-erased views of a module's tensors, as the trainer sees them.
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/core/device_id.hpp"
#include "ddp/core/dtype.hpp"

namespace ddp {

using shape_t = std::vector<std::int64_t>;

inline std::string to_string(const shape_t& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  s += ']';
  return s;
}

struct tensor_ref {
  void* data = nullptr;
  ddp::dtype type = ddp::dtype::f32;
  shape_t shape;
  device_id device = device_id::cpu();

  std::size_t numel() const {
    return static_cast<std::size_t>(
        std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>{}));
  }
  std::size_t bytes() const { return numel() * size_of(type); }

  template <class T>
  std::span<T> as() const {
    if (dtype_of<T> != type)
      throw std::invalid_argument("ddp: tensor holds " + std::string(name_of(type)) +
                                  ", not " + std::string(name_of(dtype_of<T>)));
    return {static_cast<T*>(data), numel()};
  }
};

template <class T>
tensor_ref make_tensor_ref(std::span<T> data, shape_t shape, device_id device = device_id::cpu()) {
  return {const_cast<std::remove_const_t<T>*>(data.data()), dtype_of<T>, std::move(shape), device};
}

class buffer_version;

// A trainable parameter: its value and the gradient the module's backward accumulates into.
struct parameter_ref {
  std::string name;
  tensor_ref value;
  tensor_ref grad;
};

// Module state that is not trained (running statistics, counters). `version` is bumped on
// every write; see buffer_version.
struct buffer_ref {
  std::string name;
  tensor_ref value;
  buffer_version* version = nullptr;
};

}  // namespace ddp
