#pragma once
// Element loops on host memory, written so the compiler vectorises them: contiguous
// __restrict__ pointers, no branches in the body.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "ddp/core/reduce_op.hpp"
#include "ddp/core/segment.hpp"
#include "ddp/core/vectorize.hpp"
#include "ddp/host/half.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::host {

template <class T>
DDP_VECTORIZE inline void accumulate(T* DDP_RESTRICT acc, const T* DDP_RESTRICT x, std::size_t n,
                                     reduce_op op) {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg:
      for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
      break;
    case reduce_op::min:
      for (std::size_t i = 0; i < n; ++i) acc[i] = x[i] < acc[i] ? x[i] : acc[i];
      break;
    case reduce_op::max:
      for (std::size_t i = 0; i < n; ++i) acc[i] = x[i] > acc[i] ? x[i] : acc[i];
      break;
  }
}

// acc = a OP b (the first step of a reduction, without copying `a` first)
template <class T>
DDP_VECTORIZE inline void combine(T* DDP_RESTRICT acc, const T* DDP_RESTRICT a, const T* DDP_RESTRICT b,
                                  std::size_t n, reduce_op op) {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg:
      for (std::size_t i = 0; i < n; ++i) acc[i] = a[i] + b[i];
      break;
    case reduce_op::min:
      for (std::size_t i = 0; i < n; ++i) acc[i] = b[i] < a[i] ? b[i] : a[i];
      break;
    case reduce_op::max:
      for (std::size_t i = 0; i < n; ++i) acc[i] = b[i] > a[i] ? b[i] : a[i];
      break;
  }
}

DDP_VECTORIZE inline void scale(float* DDP_RESTRICT x, std::size_t n, float factor) {
  for (std::size_t i = 0; i < n; ++i) x[i] *= factor;
}

// The sum of x[i]^2 in double, in a fixed order (four running sums, then theirs): the same bits
// on every run and every rank.
inline double sum_of_squares(const float* x, std::size_t n) {
  double s[4] = {0, 0, 0, 0};
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) s[k] += static_cast<double>(x[i + k]) * x[i + k];
  for (; i < n; ++i) s[0] += static_cast<double>(x[i]) * x[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// x /= divisor. A floating-point divisor that is a power of two has an exact reciprocal, and
// multiplying by it gives the quotient's bits: a multiply costs a fraction of a divide.
// 1 / divisor when it is exact: a power of two whose reciprocal is finite (not past the
// exponent range), so multiplying by it gives the quotient's bits.
template <class T>
std::optional<T> exact_reciprocal(T divisor) {
  int exponent = 0;
  const T reciprocal = T(1) / divisor;
  if (std::frexp(divisor, &exponent) == T(0.5) && std::isfinite(reciprocal)) return reciprocal;
  return std::nullopt;
}

template <class T>
DDP_VECTORIZE inline void divide(T* DDP_RESTRICT x, std::size_t n, T divisor) {
  if constexpr (std::is_floating_point_v<T>) {
    if (const auto reciprocal = exact_reciprocal(divisor)) {
      const T r = *reciprocal;
      for (std::size_t i = 0; i < n; ++i) x[i] *= r;
      return;
    }
  }
  for (std::size_t i = 0; i < n; ++i) x[i] /= divisor;
}

// Where acc[i] (a sum of `sources` divided by world) is not finite although every input is,
// acc[i] = the sum of the inputs each divided first. `load` reads a source element as a T (16-bit
// sources are widened).
template <class T, class S = T, class Load = std::identity>
void divide_first_where_overflowed(std::span<const S* const> sources, T* acc, std::size_t begin, std::size_t len,
                                   T world, Load load = {}) {
  for (std::size_t i = 0; i < len; ++i) {
    if (std::isfinite(acc[i])) continue;
    T sum = 0;
    bool finite_inputs = true;
    for (const S* s : sources) {
      const T x = load(s[begin + i]);
      finite_inputs = finite_inputs && std::isfinite(x);
      sum += x / world;
    }
    if (finite_inputs) acc[i] = sum;
  }
}

// divide(x, n, divisor) for floating T, and whether some quotient is infinite or NaN (its exponent
// bits all set): the check rides in the same pass, branch-free.
template <class T>
DDP_VECTORIZE inline bool divide_and_find_nonfinite(T* DDP_RESTRICT x, std::size_t n, T divisor) {
  using bits_t = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  constexpr bits_t exponent = static_cast<bits_t>(sizeof(T) == 4 ? 0x7f800000ull : 0x7ff0000000000000ull);
  auto nonfinite = [](T v) {
    bits_t b;
    std::memcpy(&b, &v, sizeof b);
    return static_cast<bits_t>((b & exponent) == exponent);
  };
  bits_t found = 0;
  if (const auto reciprocal = exact_reciprocal(divisor)) {
    const T r = *reciprocal;
    for (std::size_t i = 0; i < n; ++i) found |= nonfinite(x[i] *= r);
  } else {
    for (std::size_t i = 0; i < n; ++i) found |= nonfinite(x[i] /= divisor);
  }
  return found != 0;
}

// A copy whose destination bypasses the cache (non-temporal stores), for outputs too large to
// stay there: an ordinary store first reads each destination line it will overwrite, so a large
// reduction would read its outputs as well as its inputs. Callers issue stream_fence() before
// another thread reads the destination.
inline void stream_copy(void* dst, const void* src, std::size_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const std::size_t head = std::min(bytes, (16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  std::size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Outputs from this many bytes per target on are written with stream_copy.
inline constexpr std::size_t stream_output_bytes = std::size_t{1} << 20;

// Reduces `sources` (fixed order: index 0 first, so every rank computes the same bits)
// elementwise and writes the result to every pointer in `targets`. Works in chunks that stay
// in L1, so a target may alias a source.
//
// avg sums, then divides (a power-of-two world divides exactly). Where the sum of finite inputs
// overflows, that element is computed again dividing each input first, which keeps a finite
// average finite (two ranks at 2^127 average to 2^127, not inf); every other element keeps the
// bits of the sum-then-divide.
template <class T>
void reduce_to_all(std::span<const T* const> sources, std::span<T* const> targets,
                   std::size_t n, reduce_op op, std::size_t world) {
  constexpr std::size_t chunk = 4096 / sizeof(T) * 4;  // 16 KiB of accumulator
  alignas(64) T acc[chunk];
  // An output that is also an input (in place) is read into the cache just before it is written:
  // only the others are streamed.
  std::vector<char> streamed(n * sizeof(T) >= stream_output_bytes ? targets.size() : 0);
  for (std::size_t k = 0; k < streamed.size(); ++k)
    streamed[k] = std::find(sources.begin(), sources.end(), targets[k]) == sources.end();
  for (std::size_t begin = 0; begin < n; begin += chunk) {
    const std::size_t len = std::min(chunk, n - begin);
    if (sources.size() == 1) {
      std::memcpy(acc, sources[0] + begin, len * sizeof(T));
    } else {
      combine(acc, sources[0] + begin, sources[1] + begin, len, op);
      for (std::size_t k = 2; k < sources.size(); ++k) accumulate(acc, sources[k] + begin, len, op);
    }
    if (op == reduce_op::avg) {
      if constexpr (std::is_floating_point_v<T>) {
        if (divide_and_find_nonfinite(acc, len, static_cast<T>(world)))
          divide_first_where_overflowed(sources, acc, begin, len, static_cast<T>(world));
      } else {
        divide(acc, len, static_cast<T>(world));
      }
    }
    for (std::size_t k = 0; k < targets.size(); ++k) {
      if (k < streamed.size() && streamed[k])
        stream_copy(targets[k] + begin, acc, len * sizeof(T));
      else
        std::memcpy(targets[k] + begin, acc, len * sizeof(T));
    }
  }
  if (!streamed.empty()) stream_fence();
}

inline void pack(std::span<const segment> segments, float* bucket) {
  for (const auto& s : segments)
    if (s.count && bucket + s.offset != s.tensor) std::memcpy(bucket + s.offset, s.tensor, s.count * 4);  // an empty tensor may have no storage
}

inline void unpack(std::span<const segment> segments, const float* bucket) {
  for (const auto& s : segments)
    if (s.count && bucket + s.offset != s.tensor) std::memcpy(s.tensor, bucket + s.offset, s.count * 4);
}

// One optimizer rule (ddp/optim/optimizer.hpp) over n elements with S state slots, each its own
// array: restrict pointers let the loop vectorise.
template <class Rule>
DDP_VECTORIZE inline void rule_segment(float* DDP_RESTRICT p, const float* DDP_RESTRICT g, std::size_t n,
                                       const Rule& rule) {
  const Rule r = rule;
  float none[1] = {0.0f};
  for (std::size_t i = 0; i < n; ++i) r(p[i], g[i], none);
}
template <class Rule>
DDP_VECTORIZE inline void rule_segment(float* DDP_RESTRICT p, const float* DDP_RESTRICT g, float* DDP_RESTRICT s0,
                                       std::size_t n, const Rule& rule) {
  const Rule r = rule;
  for (std::size_t i = 0; i < n; ++i) {
    float s[1] = {s0[i]};
    r(p[i], g[i], s);
    s0[i] = s[0];
  }
}
template <class Rule>
DDP_VECTORIZE inline void rule_segment(float* DDP_RESTRICT p, const float* DDP_RESTRICT g, float* DDP_RESTRICT s0,
                                       float* DDP_RESTRICT s1, std::size_t n, const Rule& rule) {
  const Rule r = rule;
  for (std::size_t i = 0; i < n; ++i) {
    float s[2] = {s0[i], s1[i]};
    r(p[i], g[i], s);
    s0[i] = s[0];
    s1[i] = s[1];
  }
}
template <class Rule>
DDP_VECTORIZE inline void rule_segment(float* DDP_RESTRICT p, const float* DDP_RESTRICT g, float* DDP_RESTRICT s0,
                                       float* DDP_RESTRICT s1, float* DDP_RESTRICT s2, std::size_t n,
                                       const Rule& rule) {
  const Rule r = rule;
  for (std::size_t i = 0; i < n; ++i) {
    float s[3] = {s0[i], s1[i], s2[i]};
    r(p[i], g[i], s);
    s0[i] = s[0];
    s1[i] = s[1];
    s2[i] = s[2];
  }
}

// The rule over every segment: parameter s.tensor, its gradient at grad + s.offset, state slot k
// at state + k * stride + s.offset.
template <int S, class Rule>
void elementwise(std::span<const segment> segments, const float* grad, float* state, std::size_t stride,
                 const Rule& rule) {
  static_assert(S >= 0 && S <= 3, "ddp: the host device runs rules with 0 to 3 state slots");
  for (const auto& s : segments) {
    float* st = state + s.offset;
    if constexpr (S == 0) rule_segment(s.tensor, grad + s.offset, s.count, rule);
    else if constexpr (S == 1) rule_segment(s.tensor, grad + s.offset, st, s.count, rule);
    else if constexpr (S == 2) rule_segment(s.tensor, grad + s.offset, st, st + stride, s.count, rule);
    else rule_segment(s.tensor, grad + s.offset, st, st + stride, st + 2 * stride, s.count, rule);
  }
}

// reduce_to_all for 16-bit data: every source widened to f32 and combined in a fixed order (index
// 0 first), avg divided in f32, and each result rounded once. So no partial sum is rounded to 16
// bits, and a sum past the 16-bit range cannot overflow before the division: where even the f32
// sum overflowed while every input was finite, the element is summed again from inputs divided
// first. A target may alias a source.
template <class Format>
void reduce_to_all_half(std::span<const std::uint16_t* const> sources, std::span<std::uint16_t* const> targets,
                        std::size_t n, reduce_op op, std::size_t world) {
  constexpr std::size_t chunk = 4096;
  alignas(64) float acc[chunk];
  alignas(64) float next[chunk];
  alignas(64) std::uint16_t rounded[chunk];
  const float divisor = static_cast<float>(world);
  for (std::size_t begin = 0; begin < n; begin += chunk) {
    const std::size_t len = std::min(chunk, n - begin);
    widen<Format>(sources[0] + begin, acc, len);
    for (std::size_t k = 1; k < sources.size(); ++k) {
      widen<Format>(sources[k] + begin, next, len);
      accumulate(acc, next, len, op);
    }
    if (op == reduce_op::avg && divide_and_find_nonfinite(acc, len, divisor))
      divide_first_where_overflowed(sources, acc, begin, len, divisor, &Format::from);
    narrow<Format>(acc, rounded, len, 1.0f);
    for (std::uint16_t* t : targets) std::memcpy(t + begin, rounded, len * sizeof(std::uint16_t));
  }
}

// The instances the communicators use, compiled once in libddp_runtime (ddp/core/compiled_runtime.hpp):
// DDP_HOST_KERNEL_INSTANCES(extern template) declares them, (template) defines them.
#define DDP_HOST_KERNEL_INSTANCES(kind)                                                                        \
  kind void reduce_to_all<float>(std::span<const float* const>, std::span<float* const>, std::size_t, reduce_op, \
                                 std::size_t);                                                                 \
  kind void reduce_to_all<double>(std::span<const double* const>, std::span<double* const>, std::size_t,        \
                                  reduce_op, std::size_t);                                                     \
  kind void reduce_to_all<std::int32_t>(std::span<const std::int32_t* const>, std::span<std::int32_t* const>,   \
                                        std::size_t, reduce_op, std::size_t);                                  \
  kind void reduce_to_all<std::int64_t>(std::span<const std::int64_t* const>, std::span<std::int64_t* const>,   \
                                        std::size_t, reduce_op, std::size_t);                                  \
  kind void reduce_to_all<std::uint8_t>(std::span<const std::uint8_t* const>, std::span<std::uint8_t* const>,   \
                                        std::size_t, reduce_op, std::size_t);                                  \
  kind void reduce_to_all_half<bf16_format>(std::span<const std::uint16_t* const>, std::span<std::uint16_t* const>, \
                                            std::size_t, reduce_op, std::size_t);                              \
  kind void reduce_to_all_half<f16_format>(std::span<const std::uint16_t* const>, std::span<std::uint16_t* const>, \
                                           std::size_t, reduce_op, std::size_t);
#if DDP_RUNTIME_EXTERN
DDP_HOST_KERNEL_INSTANCES(extern template)
#endif

}  // namespace ddp::host
