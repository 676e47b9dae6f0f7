#pragma once
// Element types the communicators and devices move and reduce.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace ddp {

enum class dtype : std::uint8_t { f32, f64, i32, i64, u8, f16, bf16 };

constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32: case dtype::i32: return 4;
    case dtype::f64: case dtype::i64: return 8;
    case dtype::u8: return 1;
    case dtype::f16: case dtype::bf16: return 2;
  }
  return 0;
}

constexpr std::string_view name_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f64: return "f64";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
    case dtype::u8: return "u8";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
  }
  return "?";
}

constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::f32 || t == dtype::f64 || t == dtype::f16 || t == dtype::bf16;
}

// The 16-bit floating formats (stored as std::uint16_t; ddp/host/half.hpp converts them).
constexpr bool is_half(dtype t) noexcept { return t == dtype::f16 || t == dtype::bf16; }

template <class T>
struct dtype_of_t {
  static_assert(sizeof(T) == 0,
                "ddp: no ddp::dtype for this element type; use float, double, std::int32_t, "
                "std::int64_t or std::uint8_t");
};
template <> struct dtype_of_t<float> { static constexpr dtype value = dtype::f32; };
template <> struct dtype_of_t<double> { static constexpr dtype value = dtype::f64; };
template <> struct dtype_of_t<std::int32_t> { static constexpr dtype value = dtype::i32; };
template <> struct dtype_of_t<std::int64_t> { static constexpr dtype value = dtype::i64; };
template <> struct dtype_of_t<std::uint8_t> { static constexpr dtype value = dtype::u8; };

template <class T>
inline constexpr dtype dtype_of = dtype_of_t<std::remove_cv_t<T>>::value;

// Calls f(T{}) with the C++ type of a host-reducible dtype; throws for f16/bf16.
template <class F>
decltype(auto) visit_host_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::f32: return f(float{});
    case dtype::f64: return f(double{});
    case dtype::i32: return f(std::int32_t{});
    case dtype::i64: return f(std::int64_t{});
    case dtype::u8: return f(std::uint8_t{});
    default: break;
  }
  throw std::invalid_argument("ddp: dtype " + std::string(name_of(t)) +
                              " has no host arithmetic; cast to f32 first");
}

}  // namespace ddp
