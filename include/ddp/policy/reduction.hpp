#pragma once
// Reduction: how a step's gradients are summed over its micro-batches and ranks.
//
//   plain         (default) each rank adds its micro-batches' gradients in floating point as
//                 backward accumulates them, and the communicator averages the ranks' sums
//                 (reduce_op::avg). Fast; the bits depend on how the global batch is spread over
//                 the ranks, so runs at two world sizes agree to rounding, not bitwise.
//   invariant<V>  the global batch is V virtual shards, each one micro-batch of a fixed shape on
//                 whichever rank holds it (ddp::sampler::virtual_shards deals them). Each
//                 micro-batch's gradients are kept apart and the V are summed exactly: per block
//                 of `exact::block` elements, scaled by a power of two agreed over every rank from
//                 the block's largest magnitude, rounded once to 64-bit integers, summed as
//                 integers (exact, in any order and grouping) and divided by V once. The sum is
//                 therefore the same bits at every world size that holds the V shards (1 to V
//                 ranks, dividing V or not), in-process or under MPI, replicated or sharded.
//                 Costs: the micro-batches' gradients are kept (up to ceil(V / ranks) copies of a
//                 bucket on each rank), the integers move twice the bytes of f32, and one small
//                 all_reduce (one float per block) precedes each bucket's. Rounding: an element
//                 keeps 24 significant bits down to 2^-27 of its block's largest magnitude
//                 (docs/reduction.md).
//
// A policy of this slot is a type with
//   using slot = ddp::reduction::slot;  static constexpr std::string_view name;
//   static constexpr std::size_t virtual_shards;  // 0: plain; V: the exact sum over V micro-batches
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "ddp/core/vectorize.hpp"
#include "ddp/policy/slots.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::policy::reduction {

struct slot;

namespace exact {
inline constexpr std::size_t max_shards = std::size_t{1} << 12;  // 2^12 integers below 2^51 fit in 64 bits
}

struct plain {
  using slot = reduction::slot;
  static constexpr std::string_view name = "plain";
  static constexpr std::size_t virtual_shards = 0;
};

template <std::size_t V>
struct invariant {
  static_assert(V >= 1 && V <= exact::max_shards,
                "ddp: reduction::invariant<V> takes 1 to 4096 virtual shards per step");
  using slot = reduction::slot;
  static constexpr std::string_view name = "invariant";
  static constexpr std::size_t virtual_shards = V;
  std::string describe() const { return "invariant(" + std::to_string(V) + ")"; }
};

template <class P>
concept policy = requires {
  requires std::same_as<typename P::slot, slot>;
  { P::name } -> std::convertible_to<std::string_view>;
  { P::virtual_shards } -> std::convertible_to<std::size_t>;
  requires P::virtual_shards <= exact::max_shards;
};

struct slot {
  static constexpr std::string_view name = "reduction";
  using default_policy = plain;
};

template <class P>
consteval bool diagnose() {
  static_assert(requires { { P::name } -> std::convertible_to<std::string_view>; },
                "ddp: a policy in the reduction slot lacks `static constexpr std::string_view name`");
  static_assert(requires { { P::virtual_shards } -> std::convertible_to<std::size_t>; },
                "ddp: a policy in the reduction slot lacks `static constexpr std::size_t virtual_shards` (0 for "
                "the plain floating-point average, V for the exact sum over V micro-batches; see "
                "ddp/policy/reduction.hpp)");
  if constexpr (requires { { P::virtual_shards } -> std::convertible_to<std::size_t>; })
    static_assert(P::virtual_shards <= exact::max_shards,
                  "ddp: a reduction policy's virtual_shards is at most 4096: more integers of the exact sum could "
                  "overflow 64 bits");
  return policy<P>;
}

// The exact sum's arithmetic, on host memory. A block's scale is chosen from its largest
// magnitude m over every micro-batch of every rank (an exact max, the same everywhere): with
// m = f * 2^e (0.5 <= f < 1), each value x becomes round(x * 2^k), k = 51 - e, so that
// |x| * 2^k < 2^51: the rounding is then one addition in double (round_to_integer), and up to
// 2^12 such integers add up in 64 bits without overflow.
namespace exact {

inline constexpr std::size_t block = 64;

// The power of two a block's values are scaled by; nothing for a block of zeros or a non-finite one.
inline int scale_exponent(float max) noexcept {
  int e = 0;
  std::frexp(max, &e);
  return 51 - e;
}
inline bool scalable(float max) noexcept { return max > 0.0f && max <= std::numeric_limits<float>::max(); }

// round(v) to nearest, ties to even, for |v| < 2^51: v + 1.5 * 2^52 holds the integer in the low
// bits of its significand (in the default rounding mode), and those bits less the constant's are it.
inline std::int64_t round_to_integer(double v) noexcept {
  constexpr double magic = 0x1.8p52;
  return std::bit_cast<std::int64_t>(v + magic) - std::bit_cast<std::int64_t>(magic);
}

#if DDP_RUNTIME_DEFINITIONS
// max[b] = max(max[b], |x| over block b), on |x|'s bit pattern: an unsigned integer whose order is
// the floats', above which (0x7f800000: infinity) lie the NaNs, so that the loop vectorises. A
// NaN gives the block an infinite maximum, not a NaN: a max over ranks keeps an infinity in any
// order, where a NaN would be dropped by a `x > m ? x : m` that met it second.
DDP_VECTORIZE DDP_WIDE_VECTORS DDP_RUNTIME_INLINE void block_max(std::span<const float> x,
                                                                 std::span<float> max) noexcept {
  for (std::size_t b = 0; b < max.size(); ++b) {
    std::uint32_t m = std::bit_cast<std::uint32_t>(max[b]) & 0x7fffffffu;
    const std::size_t end = std::min(x.size(), (b + 1) * block);
    for (std::size_t i = b * block; i < end; ++i) {
      const std::uint32_t a = std::bit_cast<std::uint32_t>(x[i]) & 0x7fffffffu;
      m = a > m ? a : m;
    }
    max[b] = std::bit_cast<float>(std::min(m, 0x7f800000u));
  }
}

// sums[i] += round(x[i] * 2^k(block of i)), exactly.
DDP_VECTORIZE DDP_WIDE_VECTORS DDP_RUNTIME_INLINE void accumulate(std::span<const float> x, std::span<const float> max,
                                                      std::span<std::int64_t> sums) noexcept {
  for (std::size_t b = 0; b < max.size(); ++b) {
    if (!scalable(max[b])) continue;
    const double scale = std::ldexp(1.0, scale_exponent(max[b]));  // exact: a power of two
    const std::size_t end = std::min(x.size(), (b + 1) * block);
    for (std::size_t i = b * block; i < end; ++i) sums[i] += round_to_integer(static_cast<double>(x[i]) * scale);
  }
}

// sums[i] = sum over k of round(xs[k][i] * 2^k(block of i)) for i < n, exactly: accumulate() over
// every micro-batch, a block at a time, so that each block's sums stay in cache while the
// micro-batches are added (one pass over the sums instead of one per micro-batch).
DDP_VECTORIZE DDP_WIDE_VECTORS DDP_RUNTIME_INLINE void sum_blocks(std::span<const float* const> xs, std::size_t n,
                                                      std::span<const float> max, std::span<std::int64_t> sums) noexcept {
  for (std::size_t b = 0; b < max.size(); ++b) {
    const std::size_t begin = b * block, end = std::min(n, (b + 1) * block);
    for (std::size_t i = begin; i < end; ++i) sums[i] = 0;
    if (!scalable(max[b])) continue;
    const double scale = std::ldexp(1.0, scale_exponent(max[b]));  // exact: a power of two
    for (const float* x : xs)
      for (std::size_t i = begin; i < end; ++i) sums[i] += round_to_integer(static_cast<double>(x[i]) * scale);
  }
}

// out[i] = sums[first + i] * 2^-k / shards: the integer to double, times 2^-k / shards (a power
// of two, exactly, divided by the shard count in double once per block) and rounded to float, a
// function of the sum alone; a block with an infinity or NaN is NaN, a block of zeros zero.
DDP_VECTORIZE DDP_WIDE_VECTORS DDP_RUNTIME_INLINE void to_average(std::span<const std::int64_t> sums, std::size_t first,
                                                      std::span<const float> max, std::size_t shards,
                                                      std::span<float> out) noexcept {
  const double per_shard = 1.0 / static_cast<double>(shards);
  for (std::size_t i = 0; i < out.size();) {
    const std::size_t b = (first + i) / block, end = std::min(out.size(), (b + 1) * block - first);
    const float m = max[b];
    if (!scalable(m)) {
      for (; i < end; ++i) out[i] = m == 0.0f ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const double factor = std::ldexp(per_shard, -scale_exponent(m));
    for (; i < end; ++i) out[i] = static_cast<float>(static_cast<double>(sums[first + i]) * factor);
  }
}
#else  // compiled in libddp_runtime (ddp/core/compiled_runtime.hpp)
void block_max(std::span<const float> x, std::span<float> max) noexcept;
void accumulate(std::span<const float> x, std::span<const float> max, std::span<std::int64_t> sums) noexcept;
void sum_blocks(std::span<const float* const> xs, std::size_t n, std::span<const float> max,
                std::span<std::int64_t> sums) noexcept;
void to_average(std::span<const std::int64_t> sums, std::size_t first, std::span<const float> max, std::size_t shards,
                std::span<float> out) noexcept;
#endif  // DDP_RUNTIME_DEFINITIONS

// An exact sum of integers times 2^-Bottom, in Limbs 32-bit limbs held in 64-bit words (the
// upper half absorbs carries), with a count of non-finite terms beside them (any makes the sum
// NaN). Its normalised form (every limb but the last in [0, 2^32), the last signed) is unique, so
// value() is the same bits however the terms were split over ranks and grouped. A term changes a
// word by less than 2^33, so carries go up every 2^29 terms.
template <std::size_t Limbs, int Bottom>
class fixed_point_sum {
 public:
  static constexpr std::size_t limbs = Limbs;
  using words = std::array<std::int64_t, limbs + 1>;  // the limbs, then the count of non-finite terms

  // Adds sign * m * 2^(shift - Bottom), m < 2^53: m shifted by shift % 32 spans limbs i, i + 1, i + 2.
  void add_shifted(std::uint64_t m, int shift, std::int64_t sign) noexcept {
    const unsigned r = static_cast<unsigned>(shift % 32);
    const std::uint64_t low = (m & 0xffffffffu) << r, high = (m >> 32) << r;
    const std::size_t i = static_cast<std::size_t>(shift / 32);
    words_[i] += sign * static_cast<std::int64_t>(low & 0xffffffffu);
    words_[i + 1] += sign * static_cast<std::int64_t>((low >> 32) + (high & 0xffffffffu));
    words_[i + 2] += sign * static_cast<std::int64_t>(high >> 32);
    if (++since_carry_ == (std::size_t{1} << 29)) normalize();
  }
  void add_non_finite() noexcept { ++words_[limbs]; }
  void add(const fixed_point_sum& other) noexcept {
    for (std::size_t i = 0; i <= limbs; ++i) words_[i] += other.words_[i];
    normalize();
  }
  // Carries up (an arithmetic shift: a negative word borrows): the form two ranks add, and the
  // unique one value() reads.
  void normalize() noexcept {
    for (std::size_t i = 0; i + 1 < limbs; ++i) {
      words_[i + 1] += words_[i] >> 32;
      words_[i] &= 0xffffffff;
    }
    since_carry_ = 0;
  }
  // The words to add over ranks (after normalize), and the sum's words back.
  words& data() noexcept { return words_; }
  // The sum as a double, from the normalised limbs (added top first, so within an ulp of the
  // exact sum, not always the nearest double): a function of the sum alone.
  double value() const noexcept {
    fixed_point_sum n = *this;
    n.normalize();
    if (n.words_[limbs] != 0) return std::numeric_limits<double>::quiet_NaN();
    // A negative sum borrows up to the top limb: read its magnitude, whose limbs past its own
    // size are zero (two's complement limbs would add terms beyond a double's range).
    const bool negative = n.words_[limbs - 1] < 0;
    if (negative) {
      for (std::size_t i = 0; i < limbs; ++i) n.words_[i] = -n.words_[i];
      n.normalize();
    }
    double sum = 0.0;
    for (std::size_t i = limbs; i-- > 0;)
      sum += std::ldexp(static_cast<double>(n.words_[i]), static_cast<int>(32 * i) - Bottom);
    return negative ? -sum : sum;
  }

 private:
  words words_{};
  std::size_t since_carry_ = 0;
};

// An exact sum of squares of floats, for the gradient norm under an exact sum: every square is
// an integer times 2^-298 (a float is an integer times 2^-149), 19 limbs for 2^554 (the largest
// square) times 2^40 terms.
class square_sum : public fixed_point_sum<19, 298> {
 public:
  void add(std::span<const float> x) noexcept {
    for (const float v : x) {
      if (v == 0.0f) continue;
      if (!(std::fabs(v) <= std::numeric_limits<float>::max())) {
        add_non_finite();
        continue;
      }
      int e = 0;
      const float f = std::frexp(std::fabs(v), &e);
      auto m = static_cast<std::uint64_t>(std::ldexp(f, 24));  // v = m * 2^(e - 24), m < 2^24
      int q = e - 24;
      if (q < -149) m >>= (-149 - q), q = -149;  // a subnormal's trailing zeros
      add_shifted(m * m, 2 * q + 298, 1);         // v^2 = m^2 * 2^(2q), 0 <= 2q + 298 <= 506
    }
  }
};

// An exact sum of doubles (metrics: a loss summed over samples, counts of weights): every finite
// double is an integer times 2^-1074, negative ones subtracted; 68 limbs for 2^1024 * 2^1074
// (2098 bits) and headroom for 2^40 terms.
class double_sum : public fixed_point_sum<68, 1074> {
 public:
  using fixed_point_sum::add;
  void add(double v) noexcept {
    if (v == 0.0) return;
    if (!(std::fabs(v) <= std::numeric_limits<double>::max())) return add_non_finite();
    int e = 0;
    const double f = std::frexp(std::fabs(v), &e);
    auto m = static_cast<std::uint64_t>(std::ldexp(f, 53));  // |v| = m * 2^(e - 53), m < 2^53
    int q = e - 53;
    if (q < -1074) m >>= (-1074 - q), q = -1074;  // a subnormal's trailing zeros
    add_shifted(m, q + 1074, v < 0 ? -1 : 1);
  }
};

}  // namespace exact

}  // namespace ddp::policy::reduction

// The slot's short spelling, as policy lists write it: ddp::reduction::... is ddp::policy::reduction::...
namespace ddp {
namespace reduction = policy::reduction;
}  // namespace ddp
