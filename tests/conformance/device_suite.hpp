#pragma once
// The device conformance suite: the contract of ddp::device (ddp/concepts/device.hpp) and of what
// the trainer and its hooks call beside it where a device offers it (the scaled cast to 16 bits,
// comm_hook::powersgd's matrix algebra), written once and run on every device: the host device in
// tests/host/kernels_test.cpp, the CUDA device in tests/cuda/kernels_test.cpp (both through
// DDP_DEVICE_CONFORMANCE_SUITE at the end of this file). Each function is one test body, templated
// on the device; memory comes from ddp::device_array and moves by the device's own copies. Every
// expected value is computed here, in plain C++ from the inputs, never by a device: the host device
// runs this suite too, and would otherwise check itself.
//
// Exact and bounded results:
//   bit for bit   memory copies, fill_zero, pack / unpack, scale (one f32 product per element), the
//                 casts f32 <-> f16 / bf16 (round to nearest even; a NaN becomes a quiet NaN of its
//                 sign with its payload's top bits, or zeros appended: ddp/host/half.hpp's rule)
//   bounded       sum_of_squares, the optimizer rules, axpy, gemm, orthonormalize_columns
//
// Why bounds, and not a relative tolerance. A device may evaluate a formula in another order than
// this file does, or fuse a multiply and an add into one rounding (the GPU contracts a * b + c;
// cuBLAS splits and blocks a dot product's sum, split-K), and each such choice moves the result by
// roundings of the *terms* that made it, not of the result. A K-term dot product computed in any
// order lies within about K u sum_k |a_k b_k| of the exact one (u the unit roundoff, 2^-24 in f32),
// and sum_k |a_k b_k| may be far above |sum_k a_k b_k| when the terms cancel: a 257-term dot product
// of values in [-1, 1] has terms summing to ~64 in magnitude, while among a few thousand such
// products some land near 0, where a plain relative tolerance (1e-4 of the result) is tighter than
// the roundings of any order but the reference's. So each bounded result is checked against a
// multiple of u times the magnitudes that went into it:
//   - a dot product (gemm): (2K + 4) u (|alpha| sum_k |a_k b_k| + |beta c|): K roundings of the
//     products and partial sums in whatever order, doubled for slack, and alpha's and beta's;
//   - sum_of_squares sums in double: 2 n 2^-53 sum x^2 (the device's order and this file's own sum);
//   - the rest carries its bound through the formula (`bounded` below): every operation the device
//     rounds to f32 adds u times the magnitude of its result, and each propagates its operands'
//     bounds, so a result may be off by the roundings of the terms that made it: a few ulps of the
//     magnitudes involved, whether the device rounds each operation or fuses multiply-adds. Sums in
//     double (orthonormalisation's norms and dots) take the any-order bound of a sum. Checked
//     within twice the bound: a margin for a device that splits an operation the model rounds
//     once (or a library's pow that misses its ulp), not for a lax device.
// The bounds catch what matters: one dropped term of a dot product, TF32 products in gemm, a
// coefficient of the orthonormalisation off by 1e-5, an optimizer's term left out.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/random.hpp"
#include "ddp/optim/adamw.hpp"
#include "ddp/optim/sgd.hpp"
#include "support/user_optimizer.hpp"

namespace conformance {

namespace device_detail {

// ---- Memory through the device's own calls.

template <class D, class T>
ddp::device_array<D, T> upload(D& dev, const std::vector<T>& host) {
  ddp::device_array<D, T> a(dev, host.size());
  dev.copy_from_host(a.data(), host.data(), host.size() * sizeof(T));
  return a;
}
template <class D, class T>
std::vector<T> download(D& dev, const T* p, std::size_t n) {
  std::vector<T> out(n);
  dev.copy_to_host(out.data(), p, n * sizeof(T));
  return out;
}

inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  ddp::splitmix64 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline std::string describe(float f) {
  char text[64];
  std::snprintf(text, sizeof text, "%.9g (0x%08x)", static_cast<double>(f), bits_of(f));
  return text;
}

// got[i] has want[i]'s bits, any NaN standing for any NaN.
inline void check_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool same = std::isnan(want[i]) ? std::isnan(got[i]) : bits_of(got[i]) == bits_of(want[i]);
    if (!same && bad++ == 0) first = i;
  }
  std::string message;
  if (bad)
    message = what + ": " + std::to_string(bad) + " of " + std::to_string(got.size()) + " differ, the first at " +
              std::to_string(first) + ": " + describe(got[first]) + " where " + describe(want[first]) + " is due";
  CHECK_MESSAGE(bad == 0, message);
}
template <class T>
void check_equal(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  const auto at = std::mismatch(got.begin(), got.end(), want.begin());
  std::string message;
  if (at.first != got.end())
    message = what + ": first difference at " + std::to_string(at.first - got.begin()) + ": " +
              std::to_string(+*at.first) + " where " + std::to_string(+*at.second) + " is due";
  CHECK_MESSAGE(at.first == got.end(), message);
}

// ---- Rounding bounds.

inline constexpr double u32 = 0x1p-24;  // f32's unit roundoff
inline constexpr double u64 = 0x1p-53;  // f64's
// The model's margin (see the top of the file).
inline constexpr double model_margin = 2.0;

// A value computed in double, and a bound on how far a device's evaluation of the same formula may
// lie from it. The reference's own double arithmetic rounds too: every operation adds 2^-53 of its
// result to the bound, so the bound holds against the exact value of the reference as well.
struct bounded {
  double v = 0.0;
  double e = 0.0;
};
inline bounded exact(double v) { return {v, 0.0}; }
inline bounded own(double v, double e) { return {v, e + u64 * std::fabs(v)}; }
inline bounded operator+(bounded a, bounded b) { return own(a.v + b.v, a.e + b.e); }
inline bounded operator-(bounded a, bounded b) { return own(a.v - b.v, a.e + b.e); }
inline bounded operator*(bounded a, bounded b) {
  return own(a.v * b.v, std::fabs(a.v) * b.e + std::fabs(b.v) * a.e + a.e * b.e);
}
inline bounded operator/(bounded a, bounded b) {
  const double q = a.v / b.v, room = std::fabs(b.v) - b.e;  // the divisor's distance from 0
  return own(q, room > 0 ? (a.e + std::fabs(q) * b.e) / room : std::numeric_limits<double>::infinity());
}
// |sqrt(x) - sqrt(a)| is at most |x - a| / sqrt(a) and at most sqrt(|x - a|).
inline bounded root(bounded a) {
  const double r = std::sqrt(a.v);
  return own(r, a.v > 0 ? std::min(a.e / r, std::sqrt(a.e)) : std::sqrt(a.e));
}
// The device rounds what it computed (within e of v) to f32: half an ulp, at most u (|v| + e), or
// 2^-150 below the normal range.
inline bounded f32(bounded x) { return {x.v, x.e + u32 * (std::fabs(x.v) + x.e) + 0x1p-150}; }
inline bounded f64(bounded x) { return {x.v, x.e + u64 * (std::fabs(x.v) + x.e) + 0x1p-1074}; }

// The terms of a sum whose order a device chooses: their exact sum, their bounds' sum, the sum of
// their magnitudes and their count, from which a sum's rounding bound follows.
struct any_order_terms {
  double v = 0.0, e = 0.0, magnitude = 0.0;
  std::size_t n = 0;
  void add(bounded t) {
    v += t.v;
    e += t.e;
    magnitude += std::fabs(t.v) + t.e;
    ++n;
  }
};

// A sum in double in any order (a device splits it across threads and blocks): n - 1 roundings of
// partial sums, each within 2^-53 of at most sum |terms|, and as many again for this sum's own.
struct any_order_sum64 : any_order_terms {
  bounded result() const { return {v, e + 2.0 * static_cast<double>(n) * u64 * magnitude}; }
};

// |got[i] - want[i].v| <= margin * want[i].e for every element (a NaN never is).
inline void check_within(const std::vector<float>& got, const std::vector<bounded>& want, double margin,
                         const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  double worst = 0.0;  // the largest error as a fraction of what is allowed
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double error = std::fabs(static_cast<double>(got[i]) - want[i].v), allowed = margin * want[i].e;
    if (!(error <= allowed) && bad++ == 0) first = i;
    if (allowed > 0) worst = std::max(worst, error / allowed);
  }
  std::string message;
  if (bad) {
    char text[256];
    std::snprintf(text, sizeof text,
                  ": %zu of %zu off, the first at %zu: %.9g where %.17g is due within %.3g (the worst: %.3g "
                  "times what is allowed)",
                  bad, got.size(), first, static_cast<double>(got[first]), want[first].v, margin * want[first].e, worst);
    message = what + text;
  }
  CHECK_MESSAGE(bad == 0, message);
#ifdef DDP_SUITE_SHOW
  MESSAGE(what, ": the largest error is ", worst, " of what is allowed");
#endif
}

// ---- The 16-bit formats, from their definition (IEEE binary16; bfloat16: f32's upper half).

struct half_format {
  ddp::dtype type;
  int mantissa_bits;
  int exponent_bits;
  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  double largest() const { return std::ldexp(2.0 - std::ldexp(1.0, -mantissa_bits), bias()); }
};
inline constexpr half_format f16_spec{ddp::dtype::f16, 10, 5};
inline constexpr half_format bf16_spec{ddp::dtype::bf16, 7, 8};

// The value a 16-bit pattern stands for.
inline float decode(std::uint16_t h, half_format f) {
  const unsigned exponent = (h >> f.mantissa_bits) & ((1u << f.exponent_bits) - 1);
  const unsigned mantissa = h & ((1u << f.mantissa_bits) - 1);
  const bool negative = (h >> 15) != 0;
  double magnitude;
  if (exponent == (1u << f.exponent_bits) - 1)
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exponent == 0)
    magnitude = std::ldexp(static_cast<double>(mantissa), 1 - f.bias() - f.mantissa_bits);
  else
    magnitude = std::ldexp(static_cast<double>((1u << f.mantissa_bits) + mantissa),
                           static_cast<int>(exponent) - f.bias() - f.mantissa_bits);
  return static_cast<float>(negative ? -magnitude : magnitude);  // exact: every such value is a float
}

// x rounded to the nearest value of the format, ties to even; past the largest finite value by
// half an ulp or more, infinity; a NaN stays a NaN.
inline float round_to(float x, half_format f) {
  if (std::isnan(x) || std::isinf(x)) return x;
  const double magnitude = std::fabs(static_cast<double>(x));
  const int exponent = magnitude == 0 ? 1 - f.bias() : std::max(std::ilogb(magnitude), 1 - f.bias());
  const double quantum = std::ldexp(1.0, exponent - f.mantissa_bits);  // the spacing of values there
  const double q = magnitude / quantum;                                 // exact: a power of two
  double rounded = std::floor(q);
  const double rest = q - rounded;
  if (rest > 0.5 || (rest == 0.5 && std::fmod(rounded, 2.0) != 0.0)) rounded += 1.0;
  double value = rounded * quantum;
  if (value > f.largest()) value = std::numeric_limits<double>::infinity();
  return static_cast<float>(std::signbit(x) ? -value : value);
}

// The NaN rule of every device's casts (ddp/host/half.hpp): a quiet NaN of the same sign, the
// payload's top bits kept when narrowing, zeros appended when widening.
inline std::uint16_t narrowed_nan(std::uint32_t u, half_format f) {
  const std::uint32_t sign = (u >> 31) << 15;
  const std::uint32_t exponent = ((1u << f.exponent_bits) - 1) << f.mantissa_bits;
  const std::uint32_t quiet = 1u << (f.mantissa_bits - 1);
  const std::uint32_t payload = (u & 0x7fffffu) >> (23 - f.mantissa_bits);
  return static_cast<std::uint16_t>(sign | exponent | quiet | payload);
}
inline std::uint32_t widened_nan(std::uint16_t h, half_format f) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h >> 15) << 31;
  const std::uint32_t payload = static_cast<std::uint32_t>(h & ((1u << f.mantissa_bits) - 1)) << (23 - f.mantissa_bits);
  return sign | 0x7f800000u | 0x400000u | payload;
}

// ---- Optimizer references: PyTorch's rules on one element, each operation rounded to f32.

inline void sgd_reference(const ddp::optim::sgd& o, bounded& p, bounded& m, float grad) {
  const bounded g = exact(grad);
  const bounded d = f32(g + f32(exact(o.weight_decay) * p));
  if (o.momentum == 0.0f) {  // the state is not touched
    p = f32(p - f32(exact(o.lr) * d));
    return;
  }
  m = f32(f32(exact(o.momentum) * m) + d);
  const bounded step = o.nesterov ? f32(d + f32(exact(o.momentum) * m)) : m;
  p = f32(p - f32(exact(o.lr) * step));
}

// The step's factors as PyTorch computes them once per step (in f32 here, as ddp does on the host):
// decay 1 - lr wd, step size lr / (1 - beta1^t), 1 / sqrt(1 - beta2^t).
struct adamw_factors {
  bounded decay, step_size, inverse_root_bc2;
};
inline adamw_factors adamw_reference_factors(const ddp::optim::adamw& o, int t) {
  // pow to within an ulp (glibc's powf: below one)
  auto power = [](float base, int exponent) {
    const double v = std::pow(static_cast<double>(base), exponent);
    return bounded{v, 2 * u32 * v};
  };
  const bounded one = exact(1.0);
  const bounded bc1 = f32(one - power(o.beta1, t)), bc2 = f32(one - power(o.beta2, t));
  return {f32(one - f32(exact(o.lr) * exact(o.weight_decay))), f32(exact(o.lr) / bc1), f32(one / f32(root(bc2)))};
}
inline void adamw_reference(const ddp::optim::adamw& o, const adamw_factors& k, bounded& p, bounded& m, bounded& v,
                            float grad) {
  const bounded g = exact(grad), one = exact(1.0);
  p = f32(p * k.decay);
  m = f32(f32(exact(o.beta1) * m) + f32(f32(one - exact(o.beta1)) * g));
  v = f32(f32(exact(o.beta2) * v) + f32(f32(f32(one - exact(o.beta2)) * g) * g));
  const bounded denominator = f32(f32(f32(root(v)) * k.inverse_root_bc2) + exact(o.eps));
  p = f32(p - f32(f32(k.step_size * m) / denominator));
}

// Lion (tests/support/user_optimizer.hpp), from its paper: c = b1 m + (1 - b1) g;
// p = p (1 - lr wd) - lr sign(c); m = b2 m + (1 - b2) g. Where c is within its bound of 0 the sign
// may be either: the parameter's bound takes 2 lr.
inline void lion_reference(const user::lion& o, bounded& p, bounded& m, float grad) {
  const bounded g = exact(grad), one = exact(1.0);
  const bounded c = f32(f32(exact(o.beta1) * m) + f32(f32(one - exact(o.beta1)) * g));
  const double sign = (c.v > 0) - (c.v < 0);
  const bounded decay = f32(one - f32(exact(o.lr) * exact(o.weight_decay)));
  p = f32(f32(p * decay) - f32(exact(o.lr) * exact(sign)));
  if (std::fabs(c.v) <= c.e) p.e += 2.0 * o.lr;
  m = f32(f32(exact(o.beta2) * m) + f32(f32(one - exact(o.beta2)) * g));
}

// A bucket's layout: segment k of counts[k] floats at offsets[k], 4-aligned, with some padding
// between slots; state slot s of element i at state[s * stride + i].
struct layout {
  std::vector<std::size_t> counts, offsets;
  std::size_t total = 0;
  explicit layout(std::vector<std::size_t> c) : counts(std::move(c)) {
    for (std::size_t k = 0; k < counts.size(); ++k) {
      offsets.push_back(total);
      total += (counts[k] + 3) / 4 * 4 + (k % 3 == 0 ? 4 : 0);
    }
  }
  // Whether bucket element i belongs to no segment.
  std::vector<bool> padding() const {
    std::vector<bool> free(total, true);
    for (std::size_t k = 0; k < counts.size(); ++k)
      std::fill_n(free.begin() + static_cast<std::ptrdiff_t>(offsets[k]), counts[k], false);
    return free;
  }
};

}  // namespace device_detail

// ---------------------------------------------------------------------------------------------
// Memory: allocate, the three copies (in call order on the device's queue), fill_zero, a copy onto
// itself, identity and locate.
template <class D>
void device_memory_cases(D& dev) {
  using namespace device_detail;
  static_assert(ddp::device<D>);
  CHECK(dev.id().kind == D::kind);
  ddp::device_array<D, float> none(dev, 0);  // nothing to allocate, nothing to free
  CHECK(none.size() == 0);

  const std::size_t n = 4099;
  std::vector<unsigned char> source(n);
  ddp::splitmix64 rng(5);
  for (auto& c : source) c = static_cast<unsigned char>(rng.next());
  std::vector<unsigned char> host = source;
  auto a = upload(dev, host);
  std::fill(host.begin(), host.end(), 0);  // the host source may change as soon as copy_from_host returns
  check_equal(download(dev, a.data(), n), source, "copy_from_host then copy_to_host");

  ddp::device_array<D, unsigned char> b(dev, n);
  dev.fill_zero(b.data(), n);
  std::vector<unsigned char> want(n, 0);
  check_equal(download(dev, b.data(), n), want, "fill_zero");
  // Odd sizes and byte offsets, queued one after another.
  dev.copy(b.data() + 3, a.data() + 1, 4001);
  std::copy_n(source.begin() + 1, 4001, want.begin() + 3);
  dev.copy(b.data() + 7, b.data() + 7, 100);  // onto itself: nothing changes
  dev.fill_zero(b.data() + 1000, 17);
  std::fill_n(want.begin() + 1000, 17, 0);
  const unsigned char three[3] = {1, 2, 3};
  dev.copy_from_host(b.data() + 4098, three, 1);
  want[4098] = 1;
  dev.copy(b.data(), a.data(), 0);  // nothing to copy
  dev.fill_zero(b.data(), 0);
  dev.synchronize();
  check_equal(download(dev, b.data(), n), want, "copy, fill_zero and copy_from_host at odd offsets and sizes");
  std::vector<unsigned char> part(5, 0xEE);
  dev.copy_to_host(part.data() + 1, b.data() + 2, 3);
  check_equal(part, std::vector<unsigned char>{0xEE, want[2], want[3], want[4], 0xEE}, "copy_to_host of 3 bytes");

  // Where memory lives, when the device can tell.
  if (const auto where = dev.locate(a.data())) CHECK(*where == dev.id());
  if constexpr (D::kind != ddp::device_kind::cpu) {
    if (const auto where = dev.locate(host.data())) CHECK(*where == ddp::device_id::cpu());
  }
}

// scale: x[i] *= factor, one f32 product, bit for bit; aligned and one float off, with a tail; inf,
// NaN, zeros and subnormals included.
template <class D>
void device_scale_cases(D& dev) {
  using namespace device_detail;
  auto x = random_floats(1'000'003, 1);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(x[i], static_cast<int>(i % 61) - 30);
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(),
                            -1e-40f, std::numeric_limits<float>::max(), 1.0f, -3.0f};
  std::copy(std::begin(specials), std::end(specials), x.begin());
  for (float factor : {0.37f, 2.0f, -0.5f, 3.0f, 0.0f, 1e-30f})
    for (std::size_t offset : {0u, 1u}) {
      auto d = upload(dev, x);
      dev.scale(d.data() + offset, x.size() - offset, factor);
      std::vector<float> want = x;
      for (std::size_t i = offset; i < want.size(); ++i) want[i] = x[i] * factor;
      check_bits(download(dev, d.data(), x.size()), want,
                 "scale by " + describe(factor) + " from element " + std::to_string(offset));
    }
  for (std::size_t n : {0u, 1u, 3u, 5u}) {  // shorter than any vector width
    auto d = upload(dev, x);
    dev.scale(d.data() + 1, n, 0.5f);
    std::vector<float> want = x;
    for (std::size_t i = 1; i < 1 + n; ++i) want[i] = x[i] * 0.5f;
    check_bits(download(dev, d.data(), 16), std::vector<float>(want.begin(), want.begin() + 16),
               "scale of " + std::to_string(n) + " elements");
  }
}

// sum_of_squares: the sum of x[i]^2 in double (each square exact there), within the bound of a sum
// in any order; the same bits on every run, and for the same values in other memory.
template <class D>
void device_sum_of_squares_cases(D& dev) {
  using namespace device_detail;
  ddp::device_array<D, float> empty(dev, 0);
  CHECK(dev.sum_of_squares(empty.data(), 0) == 0.0);
  for (std::size_t n : {1u, 7u, 1000u, 4099u, 1'000'003u}) {
    CAPTURE(n);
    auto x = random_floats(n, 3);
    for (std::size_t i = 0; i < n; ++i) x[i] = std::ldexp(x[i], static_cast<int>(i % 41) - 20);
    long double exact_sum = 0;  // wider than double where the platform has it
    for (float v : x) exact_sum += static_cast<long double>(v) * v;
    const double want = static_cast<double>(exact_sum);
    const double allowed = 2.0 * static_cast<double>(n) * u64 * want;
    auto d = upload(dev, x);
    const double got = dev.sum_of_squares(d.data(), n);
    INFO("sum_of_squares ", got, " where ", want, " is due within ", allowed);
    CHECK(std::fabs(got - want) <= allowed);
    const double again = dev.sum_of_squares(d.data(), n);
    CHECK(std::memcmp(&again, &got, sizeof got) == 0);
    auto copy = upload(dev, x);
    const double elsewhere = dev.sum_of_squares(copy.data(), n);
    CHECK(std::memcmp(&elsewhere, &got, sizeof got) == 0);
  }
}

// pack: bucket[offset ..] = *tensor; unpack: the other way; bit for bit, for segments of unequal
// sizes, an empty one without storage, and one already in its place in the bucket (a bound
// gradient), which both leave alone. The bucket's padding is never written.
template <class D>
void device_pack_unpack_cases(D& dev) {
  using namespace device_detail;
  const layout l({1, 5, 4096, 0, 3, 100'001, 7, 2});
  const std::size_t in_place = 4;  // tensor k = 4 lives in the bucket
  const auto initial = random_floats(l.total, 8);
  auto bucket = upload(dev, initial);
  std::vector<float> want = initial;
  std::vector<std::vector<float>> values;
  std::vector<ddp::device_array<D, float>> tensors;
  std::vector<ddp::segment> segs;
  for (std::size_t k = 0; k < l.counts.size(); ++k) {
    values.push_back(random_floats(l.counts[k], 10 + k));
    if (k == in_place) {  // pack leaves its slot as it was
      segs.push_back({bucket.data() + l.offsets[k], l.offsets[k], l.counts[k]});
      tensors.emplace_back();
      continue;
    }
    tensors.push_back(upload(dev, values[k]));
    segs.push_back({tensors[k].data(), l.offsets[k], l.counts[k]});  // the empty one: no storage (nullptr)
    std::copy(values[k].begin(), values[k].end(), want.begin() + static_cast<std::ptrdiff_t>(l.offsets[k]));
  }
  dev.pack(segs, bucket.data());
  check_bits(download(dev, bucket.data(), l.total), want, "the bucket after pack");

  // New bucket contents, unpacked into the tensors; the in-place one is the bucket itself.
  const auto next = random_floats(l.total, 9);
  dev.copy_from_host(bucket.data(), next.data(), l.total * sizeof(float));
  dev.unpack(segs, bucket.data());
  check_bits(download(dev, bucket.data(), l.total), next, "the bucket after unpack");
  for (std::size_t k = 0; k < l.counts.size(); ++k) {
    if (k == in_place) continue;
    const std::vector<float> slot(next.begin() + static_cast<std::ptrdiff_t>(l.offsets[k]),
                                  next.begin() + static_cast<std::ptrdiff_t>(l.offsets[k] + l.counts[k]));
    check_bits(download(dev, tensors[k].data(), l.counts[k]), slot, "tensor " + std::to_string(k) + " after unpack");
  }
  dev.pack({}, bucket.data());  // no segments: nothing happens
  dev.unpack({}, bucket.data());
  check_bits(download(dev, bucket.data(), l.total), next, "the bucket after an empty pack and unpack");
}

// Many segments of very unequal sizes (230, more than one CUDA launch holds; empty, odd and 4-aligned
// sizes, one of 300,001 floats; every tenth already in the bucket): pack, scale, unpack, then SGD
// with momentum over the same layout.
template <class D>
void device_many_segments_cases(D& dev) {
  using namespace device_detail;
  std::vector<std::size_t> counts;
  for (std::size_t k = 0; k < 230; ++k) counts.push_back(k == 17 ? 300'001 : (k * 37) % 1031);
  const layout l(counts);
  auto in_place = [](std::size_t k) { return k % 10 == 3; };
  const auto initial = random_floats(l.total, 99);
  auto bucket = upload(dev, initial);
  std::vector<float> want = initial;
  std::vector<std::vector<float>> values(counts.size());
  std::vector<ddp::device_array<D, float>> tensors(counts.size());
  std::vector<ddp::segment> segs;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    const auto at = static_cast<std::ptrdiff_t>(l.offsets[k]);
    if (in_place(k)) {
      segs.push_back({bucket.data() + l.offsets[k], l.offsets[k], counts[k]});
      continue;
    }
    values[k] = random_floats(counts[k], 1000 + k);
    std::copy(values[k].begin(), values[k].end(), want.begin() + at);
    tensors[k] = upload(dev, values[k]);
    segs.push_back({tensors[k].data(), l.offsets[k], counts[k]});
  }
  dev.pack(segs, bucket.data());
  check_bits(download(dev, bucket.data(), l.total), want, "the bucket after pack");

  dev.scale(bucket.data(), l.total, 2.0f);
  for (auto& v : want) v *= 2.0f;
  dev.unpack(segs, bucket.data());
  check_bits(download(dev, bucket.data(), l.total), want, "the bucket after scale and unpack");
  std::size_t wrong_tensors = 0;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    if (in_place(k)) continue;
    const auto got = download(dev, tensors[k].data(), counts[k]);
    wrong_tensors += !std::equal(got.begin(), got.end(), want.begin() + static_cast<std::ptrdiff_t>(l.offsets[k]),
                                 [](float a, float b) { return bits_of(a) == bits_of(b); });
  }
  CHECK(wrong_tensors == 0);

  // SGD: parameters are the tensors (the bucket itself for the in-place ones), gradients and
  // momentum laid out as the bucket.
  const auto grad = random_floats(l.total, 123);
  const auto momentum0 = random_floats(l.total, 124, -0.1f, 0.1f);
  auto g = upload(dev, grad);
  auto m = upload(dev, momentum0);
  const ddp::optim::sgd o{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f};
  std::vector<bounded> p_ref(l.total), m_ref(l.total);
  for (std::size_t i = 0; i < l.total; ++i) p_ref[i] = exact(want[i]), m_ref[i] = exact(momentum0[i]);
  const auto padding = l.padding();
  for (int step = 1; step <= 2; ++step) {
    dev.template elementwise<1>(segs, g.data(), m.data(), l.total, o.at(step));
    for (std::size_t i = 0; i < l.total; ++i)
      if (!padding[i]) sgd_reference(o, p_ref[i], m_ref[i], grad[i]);
  }
  // The parameters in their own tensors, one after another; the bucket: the in-place parameters,
  // and elsewhere its bits as they were.
  std::vector<float> got_params;
  std::vector<bounded> want_params, want_bucket(l.total);
  for (std::size_t i = 0; i < l.total; ++i) want_bucket[i] = exact(want[i]);
  for (std::size_t k = 0; k < counts.size(); ++k) {
    const auto at = static_cast<std::ptrdiff_t>(l.offsets[k]), end = at + static_cast<std::ptrdiff_t>(counts[k]);
    if (in_place(k)) {
      std::copy(p_ref.begin() + at, p_ref.begin() + end, want_bucket.begin() + at);
      continue;
    }
    const auto got = download(dev, tensors[k].data(), counts[k]);
    got_params.insert(got_params.end(), got.begin(), got.end());
    want_params.insert(want_params.end(), p_ref.begin() + at, p_ref.begin() + end);
  }
  check_within(got_params, want_params, model_margin, "parameters after 2 SGD steps over 230 segments");
  check_within(download(dev, bucket.data(), l.total), want_bucket, model_margin,
               "the bucket (parameters in place) after 2 SGD steps over 230 segments");
  check_within(download(dev, m.data(), l.total), m_ref, model_margin, "momentum after 2 SGD steps over 230 segments");
}

// NaNs and infinities, bit for bit both ways (above, a NaN stood for any NaN): f32 NaNs of both
// signs and many payloads, quiet and signalling, some with a payload only in the bits a narrowing
// drops (it must still narrow to a NaN, not to an infinity), and both infinities, narrowed scaled
// or not; every 16-bit NaN and infinity widened, and narrowed back to itself, quieted. Aligned and
// one element off, at counts with tails past any vector width, so vector and scalar paths see them.
template <class D>
void device_cast_nan_and_inf_cases(D& dev) {
  using namespace device_detail;
  const std::uint32_t magnitudes[] = {
      0x7fc00000u,  // the quiet NaN without payload
      0x7f800001u,  // signalling, payload in the lowest bit only
      0x7fa00000u,  // signalling, payload in the top bits
      0x7fffffffu,  // every payload bit
      0x7f812345u,  // signalling, payload in kept and dropped bits
      0x7fc02000u,  // quiet, f16's lowest kept bit
      0x7f802000u,  // signalling, only f16's lowest kept bit (bf16 drops it)
      0x7f810000u,  // signalling, only bf16's lowest kept bit
      0x7fd55555u,  // quiet, alternating payload
      0x7f800000u,  // infinity
  };
  constexpr std::size_t kinds = std::size(magnitudes);
  std::vector<std::uint32_t> bits;
  for (std::size_t i = 0; i < 10 * kinds + 3; ++i)  // each kind at several lanes, both signs
    bits.push_back(magnitudes[i % kinds] | ((i / kinds + i) % 2 ? 0x80000000u : 0u));
  std::vector<float> x(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) x[i] = float_of(bits[i]);
  auto dx = upload(dev, x);
  constexpr bool scaled = requires(D& d, ddp::const_buffer s, ddp::mutable_buffer t) { d.cast(s, t, 1.0f); };
  for (const half_format f : {f16_spec, bf16_spec}) {
    const std::string name(ddp::name_of(f.type));
    const auto infinity = static_cast<std::uint16_t>(((1u << f.exponent_bits) - 1) << f.mantissa_bits);
    for (std::size_t offset : {0u, 1u})
      for (float factor : {1.0f, 0.5f, 3.0f}) {  // a NaN is not multiplied; an infinity stays one
        if (factor != 1.0f && !scaled) continue;
        const std::size_t count = bits.size() - offset;
        ddp::device_array<D, std::uint16_t> h(dev, bits.size());
        const ddp::const_buffer from{dx.data() + offset, count, ddp::dtype::f32};
        const ddp::mutable_buffer to{h.data() + offset, count, f.type};
        if constexpr (scaled) dev.cast(from, to, factor);
        else dev.cast(from, to);
        std::vector<std::uint16_t> want(count);
        for (std::size_t i = 0; i < count; ++i) {
          const std::uint32_t u = bits[offset + i];
          want[i] = std::isnan(x[offset + i]) ? narrowed_nan(u, f)
                                              : static_cast<std::uint16_t>(((u >> 31) << 15) | infinity);
        }
        check_equal(download(dev, h.data() + offset, count), want,
                    "NaNs and infinities, f32 -> " + name + " times " + describe(factor) + " from element " +
                        std::to_string(offset));
      }
    // Every 16-bit NaN and infinity, both signs, to f32 and back.
    std::vector<std::uint16_t> specials;
    for (std::uint32_t m = 0; m < (1u << f.mantissa_bits); ++m)
      for (std::uint32_t sign : {0u, 0x8000u}) specials.push_back(static_cast<std::uint16_t>(sign | infinity | m));
    const std::size_t count = specials.size();
    std::vector<std::uint32_t> wide_want(count);
    std::vector<std::uint16_t> back_want(count);
    for (std::size_t i = 0; i < count; ++i) {
      const bool nan = (specials[i] & ~infinity & 0x7fffu) != 0;
      wide_want[i] = nan ? widened_nan(specials[i], f) : bits_of(decode(specials[i], f));
      back_want[i] = nan ? static_cast<std::uint16_t>(specials[i] | (1u << (f.mantissa_bits - 1))) : specials[i];
    }
    auto dh = upload(dev, specials);
    for (std::size_t offset : {0u, 1u}) {
      ddp::device_array<D, float> wide(dev, count);
      dev.cast({dh.data() + offset, count - offset, f.type}, {wide.data() + offset, count - offset, ddp::dtype::f32});
      const auto got = download(dev, wide.data() + offset, count - offset);
      std::vector<std::uint32_t> got_bits(got.size());
      for (std::size_t i = 0; i < got.size(); ++i) got_bits[i] = bits_of(got[i]);
      check_equal(got_bits, std::vector<std::uint32_t>(wide_want.begin() + static_cast<std::ptrdiff_t>(offset), wide_want.end()),
                  name + " NaNs and infinities -> f32 from element " + std::to_string(offset));
      ddp::device_array<D, std::uint16_t> back(dev, count);
      dev.cast({wide.data() + offset, count - offset, ddp::dtype::f32}, {back.data() + offset, count - offset, f.type});
      check_equal(download(dev, back.data() + offset, count - offset),
                  std::vector<std::uint16_t>(back_want.begin() + static_cast<std::ptrdiff_t>(offset), back_want.end()),
                  name + " NaNs and infinities -> f32 -> " + name + " from element " + std::to_string(offset));
    }
  }
}

// Casts f32 -> f16 / bf16 round to nearest even, bit for bit (every 65537th f32 bit pattern: every
// exponent, both signs, NaN, infinities, subnormals; ties; the overflow threshold), f16 / bf16 ->
// f32 is exact for every 16-bit pattern; the scaled form (where the device has it) rounds the f32
// product; aligned and one element off, with a tail; the errors a cast must raise.
template <class D>
void device_cast_cases(D& dev) {
  using namespace device_detail;
  std::vector<float> x;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 65537) x.push_back(float_of(static_cast<std::uint32_t>(u)));
  for (const half_format f : {f16_spec, bf16_spec}) {
    // Ties between neighbours, both signs, and just below them.
    const unsigned last_finite = (((1u << f.exponent_bits) - 1) << f.mantissa_bits) - 1;
    for (unsigned h = 0; h < last_finite; h += 13) {
      const double mid = (static_cast<double>(decode(static_cast<std::uint16_t>(h), f)) +
                          decode(static_cast<std::uint16_t>(h + 1), f)) / 2;
      x.push_back(static_cast<float>(mid));  // exact: one bit more than the format holds
      x.push_back(static_cast<float>(-mid));
      x.push_back(std::nextafter(static_cast<float>(mid), 0.0f));
    }
    const double top = f.largest(), half_ulp = std::ldexp(1.0, f.bias() - f.mantissa_bits - 1);
    for (double v : {top, top + half_ulp, top + half_ulp / 2, std::ldexp(1.0, -f.bias() - f.mantissa_bits)})
      if (v < std::numeric_limits<float>::max()) x.push_back(static_cast<float>(v)), x.push_back(static_cast<float>(-v));
  }
  const auto randoms = random_floats(10'001, 7, -60000.0f, 60000.0f);
  x.insert(x.end(), randoms.begin(), randoms.end());
  const std::size_t n = x.size();
  auto dx = upload(dev, x);

  constexpr bool scaled = requires(D& d, ddp::const_buffer s, ddp::mutable_buffer t) { d.cast(s, t, 1.0f); };
  for (const half_format f : {f16_spec, bf16_spec}) {
    const std::string name(ddp::name_of(f.type));
    for (std::size_t offset : {0u, 1u})  // aligned, and one element off
      for (float factor : {1.0f, 0.5f, 0.75f, 3.0f}) {  // 0.5: the ties stay ties
        if (factor != 1.0f && !scaled) continue;
        const std::size_t count = n - offset;
        ddp::device_array<D, std::uint16_t> h(dev, n);
        const ddp::const_buffer from{dx.data() + offset, count, ddp::dtype::f32};
        const ddp::mutable_buffer to{h.data() + offset, count, f.type};
        if constexpr (scaled) dev.cast(from, to, factor);
        else dev.cast(from, to);
        const auto got = download(dev, h.data() + offset, count);
        std::vector<float> got_values(count), want(count);
        for (std::size_t i = 0; i < count; ++i) {
          got_values[i] = decode(got[i], f);
          want[i] = round_to(x[offset + i] * factor, f);
        }
        check_bits(got_values, want,
                   "f32 -> " + name + " times " + describe(factor) + " from element " + std::to_string(offset));
      }
    // Every 16-bit pattern to f32, then back: exact both ways (a NaN stays a NaN).
    std::vector<std::uint16_t> all(65536);
    std::vector<float> want(all.size());
    for (std::size_t i = 0; i < all.size(); ++i) {
      all[i] = static_cast<std::uint16_t>(i);
      want[i] = decode(all[i], f);
    }
    auto dh = upload(dev, all);
    ddp::device_array<D, float> wide(dev, all.size());
    dev.cast({dh.data(), all.size(), f.type}, {wide.data(), all.size(), ddp::dtype::f32});
    check_bits(download(dev, wide.data(), all.size()), want, name + " -> f32, every pattern");
    ddp::device_array<D, std::uint16_t> back(dev, all.size());
    dev.cast({wide.data() + 1, all.size() - 1, ddp::dtype::f32}, {back.data() + 1, all.size() - 1, f.type});
    const auto narrowed = download(dev, back.data() + 1, all.size() - 1);
    std::size_t wrong = 0;
    for (std::size_t i = 1; i < all.size(); ++i)
      wrong += std::isnan(want[i]) ? !std::isnan(decode(narrowed[i - 1], f)) : narrowed[i - 1] != all[i];
    CHECK_MESSAGE(wrong == 0, name, ": f32 -> ", name, " -> f32 changed ", wrong, " patterns");
    // Same dtype: a copy.
    ddp::device_array<D, std::uint16_t> same(dev, all.size());
    dev.cast({dh.data(), all.size(), f.type}, {same.data(), all.size(), f.type});
    check_equal(download(dev, same.data(), all.size()), all, name + " -> " + name);
  }
  ddp::device_array<D, float> same(dev, n);
  dev.cast({dx.data(), n, ddp::dtype::f32}, {same.data(), n, ddp::dtype::f32});
  check_bits(download(dev, same.data(), n), x, "f32 -> f32");
  device_cast_nan_and_inf_cases(dev);

  ddp::device_array<D, std::uint16_t> h(dev, 4);
  CHECK_THROWS_WITH_AS(dev.cast({dx.data(), 2, ddp::dtype::f32}, {h.data(), 3, ddp::dtype::f16}),
                       doctest::Contains("source has 2 elements but destination 3"), ddp::error);
  CHECK_THROWS_AS(dev.cast({dx.data(), 4, ddp::dtype::f32}, {dx.data(), 4, ddp::dtype::i32}), ddp::error);
  if constexpr (scaled)  // a factor scales f32 sources only
    CHECK_THROWS_AS(dev.cast({h.data(), 1, ddp::dtype::f16}, {dx.data(), 1, ddp::dtype::f32}, 2.0f), ddp::error);
}

namespace device_detail {

// One optimizer's rule through elementwise<S> over a layout of several segments (one empty, without
// storage), three steps, against its reference; state and gradients outside every segment untouched.
template <int S, class D, class Optimizer, class Reference>
void run_rule(D& dev, const Optimizer& o, const layout& l, float state_lo, float state_hi, Reference reference,
              const std::string& what) {
  std::vector<std::vector<float>> p0;
  std::vector<ddp::device_array<D, float>> params;
  std::vector<ddp::segment> segs;
  for (std::size_t k = 0; k < l.counts.size(); ++k) {
    p0.push_back(random_floats(l.counts[k], 20 + k));
    params.push_back(upload(dev, p0.back()));
    segs.push_back({params.back().data(), l.offsets[k], l.counts[k]});
  }
  const auto grad = random_floats(l.total, 3);
  const auto state0 = random_floats(S * l.total, 5, state_lo, state_hi);
  auto g = upload(dev, grad);
  auto state = upload(dev, state0);

  std::vector<std::vector<bounded>> p_ref(l.counts.size());
  std::vector<bounded> s_ref(state0.size());
  for (std::size_t i = 0; i < state0.size(); ++i) s_ref[i] = exact(state0[i]);
  for (std::size_t k = 0; k < l.counts.size(); ++k)
    for (float v : p0[k]) p_ref[k].push_back(exact(v));
  for (int step = 1; step <= 3; ++step) {
    dev.template elementwise<S>(segs, g.data(), state.data(), l.total, o.at(step));
    for (std::size_t k = 0; k < l.counts.size(); ++k)
      for (std::size_t i = 0; i < l.counts[k]; ++i) {
        const std::size_t at = l.offsets[k] + i;
        bounded* s[2] = {&s_ref[at], S > 1 ? &s_ref[l.total + at] : nullptr};
        reference(step, p_ref[k][i], s, grad[at]);
      }
  }
  for (std::size_t k = 0; k < l.counts.size(); ++k)
    check_within(download(dev, params[k].data(), l.counts[k]), p_ref[k], model_margin,
                 what + ": parameter " + std::to_string(k) + " (" + std::to_string(l.counts[k]) + " elements)");
  // State within its bound where segments are; elsewhere (padding) its bits as they were.
  const auto padding = l.padding();
  const auto got_state = download(dev, state.data(), state0.size());
  for (std::size_t i = 0; i < state0.size(); ++i)
    if (padding[i % l.total]) s_ref[i] = exact(state0[i]);
  check_within(got_state, s_ref, model_margin, what + ": state");
  check_bits(download(dev, g.data(), l.total), grad, what + ": gradients (read only)");
}

inline layout rule_layout() { return layout({7, 65536, 1, 0, 1031, 3, 4096}); }

}  // namespace device_detail

// The fused SGD update (ddp::optim::sgd's rule): plain, with momentum, Nesterov; weight decay;
// within f32 rounding of PyTorch's rule. Without momentum the state is not touched.
template <class D>
void device_sgd_cases(D& dev) {
  using namespace device_detail;
  for (int variant = 0; variant < 3; ++variant) {
    const ddp::optim::sgd o{.lr = 0.1f, .momentum = variant == 0 ? 0.0f : 0.9f, .weight_decay = 1e-3f,
                            .nesterov = variant == 2};
    run_rule<1>(dev, o, rule_layout(), -0.1f, 0.1f,
                [&](int, bounded& p, bounded** s, float g) { sgd_reference(o, p, *s[0], g); }, o.describe());
  }
}

// The fused AdamW update (ddp::optim::adamw's rule), state m then v, steps 1 to 3 with bias
// correction, within f32 rounding of PyTorch's rule.
template <class D>
void device_adamw_cases(D& dev) {
  using namespace device_detail;
  for (const ddp::optim::adamw o : {ddp::optim::adamw{.lr = 1e-2f}, ddp::optim::adamw{.lr = 1e-3f, .beta1 = 0.8f,
                                                                                     .eps = 1e-6f, .weight_decay = 0.1f}}) {
    const adamw_factors k[4] = {{}, adamw_reference_factors(o, 1), adamw_reference_factors(o, 2),
                                adamw_reference_factors(o, 3)};
    run_rule<2>(dev, o, rule_layout(), 0.0f, 0.1f,
                [&](int step, bounded& p, bounded** s, float g) { adamw_reference(o, k[step], p, *s[0], *s[1], g); },
                o.describe());
  }
}

// A user's optimizer, outside the library (Lion, tests/support/user_optimizer.hpp; on CUDA its
// kernel is instantiated in tests/cuda/user_optimizer.cu).
template <class D>
void device_user_rule_cases(D& dev) {
  using namespace device_detail;
  const user::lion o{.lr = 1e-2f, .weight_decay = 0.1f};
  run_rule<1>(dev, o, rule_layout(), -0.1f, 0.1f,
              [&](int, bounded& p, bounded** s, float g) { lion_reference(o, p, *s[0], g); }, o.describe());
}

namespace device_detail {

// gemm's reference: C = alpha op(A) op(B) + beta C, row-major, each element within the bound of a
// dot product in any order (the top of the file). The padding of C (columns n..ldc) is not written.
template <class D>
void gemm_case(D& dev, bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, std::size_t pad, float alpha,
               float beta, std::uint64_t seed) {
  const std::size_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
  const auto a = random_floats((ta ? k : m) * lda, seed), b = random_floats((tb ? n : k) * ldb, seed + 1),
             c0 = random_floats(m * ldc, seed + 2);
  auto da = upload(dev, a), db = upload(dev, b), dc = upload(dev, c0);
  gemm(dev, ta, tb, m, n, k, alpha, da.data(), lda, db.data(), ldb, beta, dc.data(), ldc);
  std::vector<bounded> want(c0.size());
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < ldc; ++j) {
      if (j >= n) {
        want[i * ldc + j] = exact(c0[i * ldc + j]);
        continue;
      }
      double dot = 0, magnitude = 0;
      for (std::size_t l = 0; l < k; ++l) {
        const double term = static_cast<double>(ta ? a[l * lda + i] : a[i * lda + l]) * (tb ? b[j * ldb + l] : b[l * ldb + j]);
        dot += term;
        magnitude += std::fabs(term);
      }
      const double c = static_cast<double>(beta) * c0[i * ldc + j];
      want[i * ldc + j] = {alpha * dot + c, (2.0 * static_cast<double>(k) + 4.0) * u32 *
                                                (std::fabs(alpha) * magnitude + std::fabs(c)) + 0x1p-149};
    }
  char what[160];
  std::snprintf(what, sizeof what, "gemm%s%s m %zu n %zu k %zu, leading dimensions %zu more, alpha %g beta %g",
                ta ? " A^T" : "", tb ? " B^T" : "", m, n, k, pad, static_cast<double>(alpha), static_cast<double>(beta));
  check_within(download(dev, dc.data(), c0.size()), want, 1.0, what);
}

// orthonormalize_columns' reference: Gram-Schmidt over the columns of a row-major rows x cols
// matrix, each column divided by its norm plus eps (f32), then taken out of the later ones; norms
// and dot products summed in double.
inline std::vector<bounded> orthonormalized(const std::vector<float>& a, std::size_t rows, std::size_t cols, float eps) {
  std::vector<bounded> x(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) x[i] = exact(a[i]);
  for (std::size_t j = 0; j < cols; ++j) {
    any_order_sum64 squares;
    for (std::size_t i = 0; i < rows; ++i) squares.add(x[i * cols + j] * x[i * cols + j]);
    const bounded norm = f32(f64(root(squares.result())));
    const bounded inverse = f32(exact(1.0) / f32(norm + exact(eps)));
    for (std::size_t i = 0; i < rows; ++i) x[i * cols + j] = f32(x[i * cols + j] * inverse);
    for (std::size_t k = j + 1; k < cols; ++k) {
      any_order_sum64 dot;
      for (std::size_t i = 0; i < rows; ++i) dot.add(x[i * cols + j] * x[i * cols + k]);
      const bounded d = f32(dot.result());
      for (std::size_t i = 0; i < rows; ++i) x[i * cols + k] = f32(x[i * cols + k] - f32(d * x[i * cols + j]));
    }
  }
  return x;
}

}  // namespace device_detail

// comm_hook::powersgd's matrix algebra on the device, found by argument-dependent lookup as the hook
// finds it (ddp/host/linalg.hpp, ddp/cuda/linalg.hpp): gemm in PowerSGD's three forms (P = M Q,
// Q = M^T P, M ~ P Q^T) and the fourth, with padded leading dimensions, alpha and beta; axpy;
// orthonormalize_columns, a zero column staying zero.
template <class D>
void device_linalg_cases(D& dev) {
  using namespace device_detail;
  static_assert(requires(D& d, float* x) {
    gemm(d, false, false, 1, 1, 1, 1.0f, x, 1, x, 1, 0.0f, x, 1);
    axpy(d, 1, 1.0f, x, x);
    orthonormalize_columns(d, x, 1, 1, 0.0f);
  }, "include the device's linalg header (ddp/host/linalg.hpp, ddp/cuda/linalg.hpp) before instantiating the suite");
  constexpr std::size_t rows = 3001, cols = 257, rank = 4;
  gemm_case(dev, false, false, rows, rank, cols, 0, 1.0f, 0.0f, 21);  // P = M Q
  gemm_case(dev, true, false, cols, rank, rows, 0, 1.0f, 0.0f, 24);   // Q = M^T P
  gemm_case(dev, false, true, rows, cols, rank, 0, 1.0f, 0.0f, 27);   // M ~ P Q^T
  gemm_case(dev, true, true, 5, 6, 7, 0, 1.0f, 0.0f, 30);
  for (unsigned t = 0; t < 4; ++t) gemm_case(dev, (t & 1) != 0, (t & 2) != 0, 33, 17, 65, 3, 0.5f, -2.0f, 40 + 3 * t);

  // y += alpha x
  for (float alpha : {-1.0f, 0.37f}) {
    auto y = random_floats(rows, 24);
    const auto x = random_floats(rows, 25);
    auto dy = upload(dev, y), dx = upload(dev, x);
    axpy(dev, rows, alpha, dx.data(), dy.data());
    std::vector<bounded> want(rows);
    for (std::size_t i = 0; i < rows; ++i) want[i] = f32(exact(y[i]) + f32(exact(alpha) * exact(x[i])));
    check_within(download(dev, dy.data(), rows), want, model_margin, "axpy, alpha " + describe(alpha));
  }

  // Orthonormalisation: P's shape (a zero column among them), Q's, and one column.
  const std::pair<std::size_t, std::size_t> shapes[] = {{rows, rank}, {cols, rank}, {1000, 1}};
  for (const auto& [r, c] : shapes) {
    auto a = random_floats(r * c, 21 + r);
    if (c > 1)
      for (std::size_t i = 0; i < r; ++i) a[i * c + 1] = 0.0f;
    auto da = upload(dev, a);
    orthonormalize_columns(dev, da.data(), r, c, 1e-8f);
    check_within(download(dev, da.data(), a.size()), orthonormalized(a, r, c, 1e-8f), model_margin,
                 "orthonormalize_columns " + std::to_string(r) + " x " + std::to_string(c));
  }
}

namespace device_detail {

// exp of a value within a.e of a.v: within v (e^(a.e) - 1) from exp(a.v), and the device's expf
// within 2 ulps of its own argument's (CUDA's bound; glibc's is below one), subnormals included:
// an ulp of x is at most 2 u |x|.
inline bounded exponential(bounded a) {
  const double v = std::exp(a.v), spread = v * std::expm1(a.e);
  return own(v, spread + 4.0 * u32 * (v + spread) + 0x1p-148);
}
// A sum in f32 in any order (a warp's lanes, then a shuffle tree): n roundings of partial sums,
// each within 2^-24 of at most sum |terms|.
struct any_order_sum32 : any_order_terms {
  bounded result() const { return {v, e + static_cast<double>(n + 1) * u32 * magnitude}; }
};

// The kept columns of row r (of `rows` per matrix) under the causal mask, as the contract says.
inline std::size_t kept_columns(std::size_t r, std::size_t rows, std::size_t cols, bool causal) {
  return causal ? std::min(r % rows + 1, cols) : cols;
}

// The softmax forward and backward on `matrices` rows x cols matrices, against the formula in
// double with its f32 rounding bounds; the masked columns must be +0 bit for bit.
template <class D>
void attention_softmax_case(D& dev, std::size_t matrices, std::size_t rows, std::size_t cols, float scale,
                            bool causal, float spread, std::uint64_t seed) {
  const std::size_t n = matrices * rows * cols;
  const auto scores = random_floats(n, seed, -spread, spread), dprobs = random_floats(n, seed + 1);
  auto d_scores = upload(dev, scores), d_dprobs = upload(dev, dprobs);
  auto d_probs = upload(dev, std::vector<float>(n, -1.0f)), d_dscores = upload(dev, std::vector<float>(n, -1.0f));
  attention_softmax(dev, d_scores.data(), d_probs.data(), matrices, rows, cols, scale, causal);
  const auto probs = download(dev, d_probs.data(), n);
  // The backward from the device's own probabilities (exact inputs here).
  attention_softmax_backward(dev, d_probs.data(), d_dprobs.data(), d_dscores.data(), matrices, rows, cols, scale,
                             causal);
  const auto dscores = download(dev, d_dscores.data(), n);
  // In place (probabilities over their scores, the gradient over dprobs): the same bits.
  attention_softmax(dev, d_scores.data(), d_scores.data(), matrices, rows, cols, scale, causal);
  attention_softmax_backward(dev, d_scores.data(), d_dprobs.data(), d_dprobs.data(), matrices, rows, cols, scale,
                             causal);

  std::vector<bounded> want_p(n), want_ds(n);
  std::vector<float> masked_p, masked_ds;
  for (std::size_t r = 0; r < matrices * rows; ++r) {
    const std::size_t kept = kept_columns(r, rows, cols, causal), at = r * cols;
    std::vector<bounded> z(kept), e(kept);
    bounded top{-std::numeric_limits<double>::infinity(), 0.0};
    for (std::size_t j = 0; j < kept; ++j) {
      z[j] = f32(exact(scale) * exact(scores[at + j]));
      if (z[j].v > top.v) top.v = z[j].v;
      top.e = std::max(top.e, z[j].e);
    }
    any_order_sum32 sum;
    for (std::size_t j = 0; j < kept; ++j) sum.add(e[j] = exponential(f32(z[j] - top)));
    const bounded inverse = f32(exact(1.0) / f32(sum.result()));
    any_order_sum32 dot;
    for (std::size_t j = 0; j < kept; ++j) {
      want_p[at + j] = f32(e[j] * inverse);
      dot.add(f32(exact(probs[at + j]) * exact(dprobs[at + j])));
    }
    const bounded d = f32(dot.result());
    for (std::size_t j = 0; j < kept; ++j)
      want_ds[at + j] = f32(exact(scale) * f32(exact(probs[at + j]) * f32(exact(dprobs[at + j]) - d)));
    for (std::size_t j = kept; j < cols; ++j) {
      want_p[at + j] = want_ds[at + j] = exact(0.0);
      masked_p.push_back(probs[at + j]);
      masked_ds.push_back(dscores[at + j]);
    }
  }
  char what[160];
  std::snprintf(what, sizeof what, "%zu matrices of %zu x %zu, scale %g, %s, scores in +-%g", matrices, rows, cols,
                static_cast<double>(scale), causal ? "causal" : "unmasked", static_cast<double>(spread));
  check_within(probs, want_p, model_margin, std::string("attention_softmax, ") + what);
  check_within(dscores, want_ds, model_margin, std::string("attention_softmax_backward, ") + what);
  check_bits(download(dev, d_scores.data(), n), probs, std::string("attention_softmax in place, ") + what);
  check_bits(download(dev, d_dprobs.data(), n), dscores, std::string("attention_softmax_backward in place, ") + what);
  check_bits(masked_p, std::vector<float>(masked_p.size(), 0.0f), std::string("masked probabilities, ") + what);
  check_bits(masked_ds, std::vector<float>(masked_ds.size(), 0.0f), std::string("masked gradients, ") + what);
}

}  // namespace device_detail

// Multi-head attention's softmax and its backward (ddp/host/attention_softmax.hpp's contract):
// within f32 rounding of the formula, in place the same bits as not, causal or not, rows past a warp's width, scores whose
// exponentials overflow f32 unless the row's maximum is taken out, more columns than rows;
// the masked columns exactly +0 in both directions.
template <class D>
void device_attention_softmax_cases(D& dev) {
  using namespace device_detail;
  static_assert(requires(D& d, float* x) {
    attention_softmax(d, x, x, 1, 1, 1, 1.0f, true);
    attention_softmax_backward(d, x, x, x, 1, 1, 1, 1.0f, true);
  }, "include the device's attention_softmax header (ddp/host/attention_softmax.hpp, ddp/nn/cuda/attention_softmax.hpp) "
     "before instantiating the suite");
  for (const bool causal : {true, false}) {
    attention_softmax_case(dev, 1, 1, 1, 1.0f, causal, 1.0f, 60);
    attention_softmax_case(dev, 3, 5, 5, 0.5f, causal, 2.0f, 61);
    attention_softmax_case(dev, 8, 64, 64, 0.125f, causal, 4.0f, 62);   // 4 heads of 2 sequences, head size 64
    attention_softmax_case(dev, 2, 97, 97, 1.0f, causal, 3.0f, 63);     // rows past 3 warps' width
    attention_softmax_case(dev, 2, 33, 33, 1.0f, causal, 200.0f, 64);   // e^200 overflows f32
    attention_softmax_case(dev, 2, 7, 40, 0.25f, causal, 1.0f, 65);     // more columns than rows
  }
}

}  // namespace conformance

// Every body of the suite as a doctest test case on a device of type DEVICE (default-constructed),
// each named PREFIX and what it checks. For the linalg case, include the device's linalg header first,
// and its attention_softmax header for the attention case.
#define DDP_DEVICE_CONFORMANCE_SUITE(PREFIX, DEVICE)                                                                   \
  TEST_CASE(PREFIX "memory: allocate, the three copies, fill_zero, locate") {                                          \
    DEVICE dev;                                                                                                         \
    conformance::device_memory_cases(dev);                                                                              \
  }                                                                                                                     \
  TEST_CASE(PREFIX "scale is one f32 product per element, bit for bit, aligned and misaligned") {                      \
    DEVICE dev;                                                                                                         \
    conformance::device_scale_cases(dev);                                                                               \
  }                                                                                                                     \
  TEST_CASE(PREFIX "sum_of_squares is the double sum within its rounding bound, the same bits every run") {             \
    DEVICE dev;                                                                                                         \
    conformance::device_sum_of_squares_cases(dev);                                                                      \
  }                                                                                                                     \
  TEST_CASE(PREFIX "pack and unpack move segments bit for bit, skipping empty ones and ones in place") {               \
    DEVICE dev;                                                                                                         \
    conformance::device_pack_unpack_cases(dev);                                                                         \
  }                                                                                                                     \
  TEST_CASE(PREFIX "pack, unpack and SGD over 230 segments of very unequal sizes") {                                   \
    DEVICE dev;                                                                                                         \
    conformance::device_many_segments_cases(dev);                                                                       \
  }                                                                                                                     \
  TEST_CASE(PREFIX "casts f32 <-> f16 and bf16 round to nearest even, bit for bit, scaled or not") {                   \
    DEVICE dev;                                                                                                         \
    conformance::device_cast_cases(dev);                                                                                \
  }                                                                                                                     \
  TEST_CASE(PREFIX "fused SGD (momentum, nesterov, weight decay) within f32 rounding of PyTorch's rule") {              \
    DEVICE dev;                                                                                                         \
    conformance::device_sgd_cases(dev);                                                                                 \
  }                                                                                                                     \
  TEST_CASE(PREFIX "fused AdamW within f32 rounding of PyTorch's rule with bias correction") {                         \
    DEVICE dev;                                                                                                         \
    conformance::device_adamw_cases(dev);                                                                               \
  }                                                                                                                     \
  TEST_CASE(PREFIX "a user's optimizer rule (Lion) within f32 rounding of its formula") {                               \
    DEVICE dev;                                                                                                         \
    conformance::device_user_rule_cases(dev);                                                                           \
  }                                                                                                                     \
  TEST_CASE(PREFIX "PowerSGD's algebra: gemm within a dot product's rounding bound, axpy, orthonormalize_columns") {   \
    DEVICE dev;                                                                                                         \
    conformance::device_linalg_cases(dev);                                                                              \
  }                                                                                                                     \
  TEST_CASE(PREFIX "attention's softmax, causal or not, and its backward within f32 rounding, masked entries +0") {   \
    DEVICE dev;                                                                                                         \
    conformance::device_attention_softmax_cases(dev);                                                                   \
  }
