#pragma once
// Type-erased views of contiguous element ranges, as collectives take them.
#include <cstddef>
#include <span>
#include <type_traits>

#include "ddp/core/dtype.hpp"

namespace ddp {

struct const_buffer {
  const void* data = nullptr;
  std::size_t count = 0;  // elements, not bytes
  ddp::dtype type = ddp::dtype::f32;

  std::size_t bytes() const noexcept { return count * size_of(type); }
};

struct mutable_buffer {
  void* data = nullptr;
  std::size_t count = 0;
  ddp::dtype type = ddp::dtype::f32;

  std::size_t bytes() const noexcept { return count * size_of(type); }
  operator const_buffer() const noexcept { return {data, count, type}; }
};

template <class T>
const_buffer as_buffer(std::span<const T> s) noexcept {
  return {s.data(), s.size(), dtype_of<T>};
}
template <class T>
  requires(!std::is_const_v<T>)
mutable_buffer as_buffer(std::span<T> s) noexcept {
  return {s.data(), s.size(), dtype_of<T>};
}

}  // namespace ddp
