#pragma once
// f32 functions for element loops that the compiler vectorises: e^x and erfc without calls into
// libm (whose scalar exp and erf keep a loop scalar), and sums over a fixed number of lanes, so
// that a row's sum is vectorised and its bits do not depend on the vector width the CPU has.
//
// Accuracy against double (every 13th f32 in the range; tests/nn/layers_test.cpp samples it):
// exp_f32 within 1 unit in the last place (0.99) over [-87.3, 88.7], within 2^-150 below (its
// subnormals); erfc_nonnegative_f32 within 3e-6 relatively for x <= 5; normal_cdf_f32 within 3e-6
// relatively for x in [-5, 0] and 3e-7 absolutely above 0; normal_pdf_f32 within 1e-6 relatively
// for |x| <= 5. Beyond 5 the relative error grows as x^2 * 6e-8 (x^2 rounded to f32), as in any
// f32 e^(-x^2).
//
// Each is a branch-free inline function of its argument alone: a loop gives every element the
// same bits whether the compiler vectorises it or not, at any optimisation level (the hot loops
// that use them are compiled without FMA contraction, DDP_EXACT_FLOATS).
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "ddp/core/vectorize.hpp"

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
// a * b + c stays two roundings, as written, in every clone of a function (DDP_WIDE_VECTORS): the
// bits do not depend on whether the CPU has FMA.
#define DDP_EXACT_FLOATS __attribute__((optimize("fp-contract=off")))
#define DDP_INLINE_MATH [[gnu::always_inline]] inline
#else
#define DDP_EXACT_FLOATS
#define DDP_INLINE_MATH inline
#endif

namespace ddp::host {

// e^x in f32: subnormal from -87.34 (where e^x leaves f32's normal range), 0 below -104 (where it
// rounds to 0), +infinity above 88.7228, NaN for NaN. Cody and Waite's reduction x = k ln 2 + r,
// |r| <= ln 2 / 2, and Cephes's expf polynomial for e^r.
DDP_INLINE_MATH float exp_f32(float x) noexcept {
  constexpr float lowest = -104.0f, highest = 88.72283f;
  constexpr float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds a float below 2^22 to an integer
  const float a = x < lowest ? lowest : (x > highest ? highest : x);
  const float t = a * 1.44269504088896341f + magic;
  const float k = t - magic;
  const float r = (a - k * 0.693359375f) - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^k as two factors, each a normal float for k in [-150, 128]: the product rounds once.
  const std::int32_t ki = std::bit_cast<std::int32_t>(t) - std::bit_cast<std::int32_t>(magic);
  const std::int32_t half = ki / 2;
  const float two_half = std::bit_cast<float>((half + 127) << 23);
  const float two_rest = std::bit_cast<float>((ki - half + 127) << 23);
  const float v = p * two_half * two_rest;
  return x < lowest ? 0.0f : (x > highest ? std::numeric_limits<float>::infinity() : v);
}

// erfc(x) for x >= 0 in f32 (Numerical Recipes' erfcc: t e^(-x^2 + a Chebyshev fit in t),
// t = 1 / (1 + x / 2), relative error below 1.2e-7 before rounding).
DDP_INLINE_MATH float erfc_nonnegative_f32(float x) noexcept {
  const float t = 1.0f / (1.0f + 0.5f * x);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  return t * exp_f32(p - x * x);
}

// Φ(x), the standard normal distribution function: erfc(|x| / √2) / 2 below 0 (small values keep
// their relative accuracy), 1 - that above.
DDP_INLINE_MATH float normal_cdf_f32(float x) noexcept {
  const float half_tail = 0.5f * erfc_nonnegative_f32((x < 0.0f ? -x : x) * 0.70710678118654752f);
  return x < 0.0f ? half_tail : 1.0f - half_tail;
}

// φ(x), the standard normal density.
DDP_INLINE_MATH float normal_pdf_f32(float x) noexcept {
  return 0.39894228040143268f * exp_f32(-0.5f * x * x);
}

// Sums and maxima of a row over `sum_lanes` lanes, lane j holding the elements j, j + lanes,
// j + 2 lanes, ..., combined in a fixed tree: vectorised at any width, the same bits at all.
inline constexpr std::size_t sum_lanes = 16;

struct lane_sums {
  float lane[sum_lanes] = {};

  DDP_INLINE_MATH float total() const noexcept {
    float l8[8], l4[4];
    for (std::size_t j = 0; j < 8; ++j) l8[j] = lane[j] + lane[j + 8];
    for (std::size_t j = 0; j < 4; ++j) l4[j] = l8[j] + l8[j + 4];
    return (l4[0] + l4[2]) + (l4[1] + l4[3]);
  }
};

// The sum of term(0), ..., term(n - 1) over the lanes.
template <class F>
DDP_INLINE_MATH float lane_sum(std::size_t n, F&& term) noexcept {
  lane_sums s;
  std::size_t j = 0;
  for (; j + sum_lanes <= n; j += sum_lanes)
    for (std::size_t l = 0; l < sum_lanes; ++l) s.lane[l] += term(j + l);
  for (std::size_t l = 0; j + l < n; ++l) s.lane[l] += term(j + l);
  return s.total();
}

// The largest of term(0), ..., term(n - 1) (n > 0; a NaN among them may or may not be returned).
template <class F>
DDP_INLINE_MATH float lane_max(std::size_t n, F&& term) noexcept {
  float m[sum_lanes];
  for (std::size_t l = 0; l < sum_lanes; ++l) m[l] = -std::numeric_limits<float>::infinity();
  std::size_t j = 0;
  for (; j + sum_lanes <= n; j += sum_lanes)
    for (std::size_t l = 0; l < sum_lanes; ++l) {
      const float v = term(j + l);
      m[l] = v > m[l] ? v : m[l];
    }
  for (std::size_t l = 0; j + l < n; ++l) {
    const float v = term(j + l);
    m[l] = v > m[l] ? v : m[l];
  }
  float top = m[0];
  for (std::size_t l = 1; l < sum_lanes; ++l) top = m[l] > top ? m[l] : top;
  return top;
}

}  // namespace ddp::host
