#pragma once
// The 16-bit floating formats on the host: IEEE binary16 (f16) and bfloat16 (bf16), stored as
// std::uint16_t. Conversions round to nearest even; arithmetic is done in f32 and rounded once.
//
// NaNs, the same rule on every path here (portable loops, SSE2, AVX2, F16C) and on the CUDA device
// (ddp/cuda/kernels.cuh), so a cast gives the same bits everywhere: a NaN becomes a quiet NaN of
// the same sign that keeps as much of its payload as the target holds. Narrowing keeps the
// payload's top bits (f32 0x7f812345 -> f16 0x7e09, bf16 0x7fc1), widening appends zeros (f16
// 0x7c01 -> f32 0x7fc02000); the quiet bit is set either way, so a signalling NaN whose payload
// lies only in the dropped bits still narrows to a NaN, not to an infinity. This is IEEE 754's
// recommendation and what x86's conversion instructions (F16C, SSE) do; PyTorch instead writes
// one canonical NaN (0x7FC0 for bf16 on the CPU, 0x7FFF on CUDA).
//
// bf16_format / f16_format name a format for templates (`F::to`, `F::from`, `F::type`);
// visit_half_dtype(t, f) calls f with the one `t` names.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/vectorize.hpp"

namespace ddp::host {

// Branch-free, so loops over it vectorise. A NaN: its top half, quieted (the rule above).
inline std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
// Exact; a NaN comes back quiet (its payload and sign kept).
inline float from_bf16(std::uint16_t h) {
  const std::uint32_t wide = static_cast<std::uint32_t>(h) << 16;
  const std::uint32_t quiet = static_cast<std::uint32_t>((wide & 0x7fffffffu) > 0x7f800000u) << 22;
  const std::uint32_t u = wide | quiet;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Both f16 conversions are branch-free (every case computed, one selected by masks: GCC keeps a
// ?: chain as branches), so loops over them vectorise. The method follows Fabian Giesen's notes
// on half conversion.
namespace detail {
// c ? a : b, for c 0 or 1, without a branch.
inline std::uint32_t pick(std::uint32_t c, std::uint32_t a, std::uint32_t b) { return b ^ ((a ^ b) & (0u - c)); }
}  // namespace detail

inline std::uint16_t to_f16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t mag = x & 0x7fffffffu;
  // At or past 65520 (rounds past f16's largest, 65504): inf, or a quiet NaN keeping the
  // payload's top 10 bits.
  const std::uint32_t special = detail::pick(mag > 0x7f800000u, 0x7e00u | ((mag >> 13) & 0x3ffu), 0x7c00u);
  // Below f16's smallest normal (2^-14): adding 0.5 lets the FPU round the mantissa into place.
  constexpr std::uint32_t magic_bits = 126u << 23;  // 0.5f
  float magic;
  std::memcpy(&magic, &magic_bits, 4);
  float low_f;
  std::memcpy(&low_f, &mag, 4);
  low_f += magic;
  std::uint32_t low;
  std::memcpy(&low, &low_f, 4);
  low -= magic_bits;
  // Normal: rebias the exponent and round to nearest even on the 13 bits dropped.
  const std::uint32_t normal = (mag + 0xc8000fffu + ((mag >> 13) & 1u)) >> 13;  // 0xc8000000: (15 - 127) << 23
  const std::uint32_t h =
      detail::pick(mag >= 0x477ff000u, special, detail::pick(mag < 0x38800000u, low, normal));
  return static_cast<std::uint16_t>(sign | h);
}
inline float from_f16(std::uint16_t h) {
  constexpr std::uint32_t exponent_bits = 0x7c00u << 13;
  const std::uint32_t shifted = static_cast<std::uint32_t>(h & 0x7fffu) << 13;
  const std::uint32_t exponent = shifted & exponent_bits;
  const std::uint32_t normal = shifted + ((127u - 15u) << 23);
  // Inf and NaN keep an all-ones exponent; a NaN comes back quiet.
  const std::uint32_t quiet = static_cast<std::uint32_t>((h & 0x3ffu) != 0) << 22;
  const std::uint32_t special = (normal + ((128u - 16u) << 23)) | quiet;
  // Zero and subnormals: scale the mantissa by 2^-24 through a float subtraction.
  constexpr std::uint32_t magic_bits = 113u << 23;  // 2^-14
  float magic, small_f;
  std::memcpy(&magic, &magic_bits, 4);
  const std::uint32_t small_bits = normal + (1u << 23);
  std::memcpy(&small_f, &small_bits, 4);
  small_f -= magic;
  std::uint32_t small;
  std::memcpy(&small, &small_f, 4);
  const std::uint32_t u =
      detail::pick(exponent == exponent_bits, special, detail::pick(exponent == 0, small, normal)) |
      (static_cast<std::uint32_t>(h & 0x8000u) << 16);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct bf16_format {
  static constexpr dtype type = dtype::bf16;
  static std::uint16_t to(float f) { return to_bf16(f); }
  static float from(std::uint16_t h) { return from_bf16(h); }
};
struct f16_format {
  static constexpr dtype type = dtype::f16;
  static std::uint16_t to(float f) { return to_f16(f); }
  static float from(std::uint16_t h) { return from_f16(h); }
};

using ddp::is_half;

template <class F>
decltype(auto) visit_half_dtype(dtype t, F&& f) {
  if (t == dtype::bf16) return f(bf16_format{});
  if (t == dtype::f16) return f(f16_format{});
  throw error("host", "cast", -1, "dtype " + std::string(name_of(t)) + " is not a 16-bit floating format");
}

// The element loops, as the compiler vectorises them for any target.
template <class Format>
DDP_VECTORIZE inline void narrow_loop(const float* DDP_RESTRICT src, std::uint16_t* DDP_RESTRICT dst, std::size_t n,
                                      float factor) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = Format::to(src[i] * factor);
}
template <class Format>
DDP_VECTORIZE inline void widen_loop(const std::uint16_t* DDP_RESTRICT src, float* DDP_RESTRICT dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = Format::from(src[i]);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
// x86 forms. Without SSE4.1 the compiler narrows 32-bit lanes to 16 bits with a long chain of
// shuffles, which made bf16 narrowing cost more than an f32 reduction: here the lanes are packed
// with one SSE2 packs, or sixteen at a time with AVX2. f16 uses the F16C conversions. AVX2 and
// F16C are checked once at run time (x86-64 CPUs have had them since 2013 and 2012). The bits are
// the portable loops', NaNs included (F16C quiets a NaN and keeps its payload's top bits, as the
// rule above says). Widening bf16 is a shift and a select, which the compiler vectorises as well.
// Written with GCC's vector types and the builtins that <immintrin.h> wraps: that header costs
// every translation unit that includes ddp 0.3-0.6 s to parse.
namespace half_x86 {

using f32x4 = float __attribute__((vector_size(16)));
using i32x4 = int __attribute__((vector_size(16)));
using u32x4 = unsigned __attribute__((vector_size(16)));
using f32x8 = float __attribute__((vector_size(32)));
using i32x8 = int __attribute__((vector_size(32)));
using u32x8 = unsigned __attribute__((vector_size(32)));
using i16x8 = short __attribute__((vector_size(16)));
using i64x4 = long long __attribute__((vector_size(32)));

// to_bf16 of x * factor in every lane, as 32-bit lanes; the 256-bit form is compiled for AVX2.
#define DDP_ROUND_BF16_LANES(F, U)                         \
  const F p = x * factor;                                  \
  const U u = (U)p;                                        \
  const U high = u >> 16;                                  \
  const U rounded = (u + 0x7fffu + (high & 1u)) >> 16;     \
  const U nan = (U)(p != p);                               \
  return (rounded & ~nan) | ((high | 0x40u) & nan);
inline u32x4 round_bf16(f32x4 x, float factor) { DDP_ROUND_BF16_LANES(f32x4, u32x4) }
__attribute__((target("avx2"))) inline u32x8 round_bf16(f32x8 x, float factor) { DDP_ROUND_BF16_LANES(f32x8, u32x8) }
#undef DDP_ROUND_BF16_LANES

inline void narrow_bf16(const float* src, std::uint16_t* dst, std::size_t n, float factor) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    f32x4 a, b;
    std::memcpy(&a, src + i, sizeof a);
    std::memcpy(&b, src + i + 4, sizeof b);
    // Sign-extended from 16 bits, so the signed saturating pack keeps the bits.
    const i32x4 lo = (i32x4)(round_bf16(a, factor) << 16) >> 16;
    const i32x4 hi = (i32x4)(round_bf16(b, factor) << 16) >> 16;
    const i16x8 packed = __builtin_ia32_packssdw128(lo, hi);
    std::memcpy(dst + i, &packed, sizeof packed);
  }
  for (; i < n; ++i) dst[i] = to_bf16(src[i] * factor);
}

inline bool has_f16c() {
  static const bool yes = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return yes;
}
inline bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

__attribute__((target("avx2"))) inline void narrow_bf16_avx2(const float* src, std::uint16_t* dst, std::size_t n,
                                                               float factor) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    f32x8 a, b;
    std::memcpy(&a, src + i, sizeof a);
    std::memcpy(&b, src + i + 8, sizeof b);
    const i32x8 lo = (i32x8)round_bf16(a, factor), hi = (i32x8)round_bf16(b, factor);
    // The pack interleaves the two inputs by 128-bit halves; the permute puts them in order.
    const i64x4 packed = __builtin_ia32_permdi256((i64x4)__builtin_ia32_packusdw256(lo, hi), 0xd8);
    std::memcpy(dst + i, &packed, sizeof packed);
  }
  for (; i < n; ++i) dst[i] = to_bf16(src[i] * factor);
}

__attribute__((target("avx,f16c"))) inline void narrow_f16(const float* src, std::uint16_t* dst, std::size_t n,
                                                             float factor) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    f32x8 x;
    std::memcpy(&x, src + i, sizeof x);
    const i16x8 h = __builtin_ia32_vcvtps2ph256(x * factor, 0);  // 0: round to nearest even
    std::memcpy(dst + i, &h, sizeof h);
  }
  for (; i < n; ++i) dst[i] = to_f16(src[i] * factor);
}

__attribute__((target("avx,f16c"))) inline void widen_f16(const std::uint16_t* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    i16x8 h;
    std::memcpy(&h, src + i, sizeof h);
    const f32x8 x = __builtin_ia32_vcvtph2ps256(h);
    std::memcpy(dst + i, &x, sizeof x);
  }
  for (; i < n; ++i) dst[i] = from_f16(src[i]);
}

}  // namespace half_x86
#define DDP_HALF_X86 1
#endif

// dst[i] = Format(src[i] * factor): a multiply by 1.0 is exact, so factor 1 is a plain cast.
template <class Format>
inline void narrow(const float* src, std::uint16_t* dst, std::size_t n, float factor) {
#if defined(DDP_HALF_X86)
  if constexpr (Format::type == dtype::bf16)
    return half_x86::has_avx2() ? half_x86::narrow_bf16_avx2(src, dst, n, factor)
                                : half_x86::narrow_bf16(src, dst, n, factor);
  if (Format::type == dtype::f16 && half_x86::has_f16c()) return half_x86::narrow_f16(src, dst, n, factor);
#endif
  narrow_loop<Format>(src, dst, n, factor);
}
template <class Format>
inline void widen(const std::uint16_t* src, float* dst, std::size_t n) {
#if defined(DDP_HALF_X86)
  if (Format::type == dtype::f16 && half_x86::has_f16c()) return half_x86::widen_f16(src, dst, n);
#endif
  widen_loop<Format>(src, dst, n);
}

// x = x / divisor, computed in f32 and rounded once.
template <class Format>
DDP_VECTORIZE inline void divide_half(std::uint16_t* DDP_RESTRICT x, std::size_t n, float divisor) {
  for (std::size_t i = 0; i < n; ++i) x[i] = Format::to(Format::from(x[i]) / divisor);
}

}  // namespace ddp::host
