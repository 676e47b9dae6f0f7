// The exact sum's arithmetic (ddp::reduction::exact): integers at a block's agreed scale add up to
// the same bits in any order and grouping, and stay within rounding of the real sum; the exact
// sum of squares is the same bits however the elements are split.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "ddp/core/random.hpp"
#include "ddp/policy/reduction.hpp"

namespace policy_reduction_test {

namespace exact = ddp::reduction::exact;

namespace {

std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float scale) {
  ddp::splitmix64 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(-1.0f, 1.0f) * scale;
  return v;
}

// The average of `parts` through the exact sum: the parts added in the order given.
std::vector<float> exact_average(const std::vector<std::vector<float>>& parts, std::size_t shards) {
  const std::size_t n = parts[0].size(), blocks = (n + exact::block - 1) / exact::block;
  std::vector<float> max(blocks, 0.0f);
  for (const auto& p : parts) exact::block_max(p, max);
  std::vector<std::int64_t> sums(n, 0);
  for (const auto& p : parts) exact::accumulate(p, max, sums);
  std::vector<float> out(n);
  exact::to_average(sums, 0, max, shards, out);
  return out;
}

}  // namespace

TEST_CASE("exact sum: the same bits in any order, within rounding of the real average, magnitudes mixed in a block") {
  std::vector<std::vector<float>> parts;
  for (std::uint64_t s = 0; s < 6; ++s) parts.push_back(random_floats(300, s, s % 2 ? 1e-3f : 10.0f));
  parts[2][5] = 1e-30f;  // far below its block's largest: rounded to the block's scale
  const auto forward = exact_average(parts, parts.size());
  const auto backward = exact_average({parts.rbegin(), parts.rend()}, parts.size());
  CHECK(std::memcmp(forward.data(), backward.data(), forward.size() * sizeof(float)) == 0);
  for (std::size_t i = 0; i < forward.size(); ++i) {
    long double real = 0, magnitude = 0;
    for (const auto& p : parts) real += p[i], magnitude = std::max<long double>(magnitude, std::fabs(p[i]));
    real /= parts.size();
    // One rounding to float, and the block scale's: 2^-52 of the block's largest magnitude.
    CHECK(std::fabs(static_cast<long double>(forward[i]) - real) <= std::fabs(real) * 0x1p-23 + 1e-15L * 16);
  }
}

TEST_CASE("exact sum: a block with a NaN or infinity averages to NaN, a block of zeros to zero") {
  std::vector<float> a(2 * exact::block, 1.0f), zeros(2 * exact::block, 0.0f);
  a[3] = std::numeric_limits<float>::infinity();
  const auto out = exact_average({a, zeros}, 2);
  CHECK(std::isnan(out[0]));
  CHECK(out[exact::block] == 0.5f);
  CHECK(exact_average({zeros, zeros}, 2)[0] == 0.0f);
  // A NaN gives its block an infinite maximum, which a max over ranks keeps in either order (a
  // NaN met second by `x > m ? x : m` would be dropped, and the NaN summed as a number).
  std::vector<float> nan_block(exact::block, 2.0f), max_here(1, 0.0f), max_there(1, 0.0f);
  nan_block[9] = std::numeric_limits<float>::quiet_NaN();
  exact::block_max(nan_block, max_here);
  exact::block_max(std::vector<float>(exact::block, 3.0f), max_there);
  CHECK(std::isinf(max_here[0]));
  CHECK(std::isinf(max_there[0] > max_here[0] ? max_there[0] : max_here[0]));
  CHECK(std::isinf(max_here[0] > max_there[0] ? max_here[0] : max_there[0]));
  CHECK(std::isnan(exact_average({std::vector<float>(exact::block, 3.0f), nan_block}, 2)[0]));
}

TEST_CASE("exact sum of squares: split over parts, the words add to the whole's, the value is the real sum's") {
  auto x = random_floats(10'000, 9, 3.0f);
  x[7] = 1e-40f;  // subnormal
  x[8] = 3e38f;
  exact::square_sum whole, first, second;
  whole.add(x);
  first.add(std::span<const float>(x).first(4321));
  second.add(std::span<const float>(x).subspan(4321));
  first.normalize(), second.normalize();
  for (std::size_t w = 0; w < first.data().size(); ++w) first.data()[w] += second.data()[w];
  const double split = first.value(), one = whole.value();
  CHECK(std::memcmp(&split, &one, sizeof(double)) == 0);
  long double real = 0;
  for (float v : x) real += static_cast<long double>(v) * v;
  CHECK(std::fabs(one - static_cast<double>(real)) <= static_cast<double>(real) * 1e-15);

  exact::square_sum with_nan;
  with_nan.add(std::vector<float>{1.0f, std::numeric_limits<float>::quiet_NaN()});
  CHECK(std::isnan(with_nan.value()));
}

TEST_CASE("exact sum of doubles: any order and split gives the same bits, close to the real sum, with signs, subnormals, "
          "huge terms and cancellation") {
  ddp::splitmix64 rng(17);
  std::vector<double> x;
  for (int i = 0; i < 5000; ++i) x.push_back(std::ldexp(rng.uniform(-1.0f, 1.0f), static_cast<int>(rng.below(80)) - 40));
  x.push_back(4e-320);   // subnormal
  x.push_back(1e300);    // huge, cancelled below
  x.push_back(-1e300);
  x.push_back(-0.0);
  exact::double_sum whole, first, second, reversed;
  for (double v : x) whole.add(v);
  for (std::size_t i = 0; i < x.size(); ++i) (i % 3 == 0 ? first : second).add(x[i]);
  for (std::size_t i = x.size(); i-- > 0;) reversed.add(x[i]);
  first.add(second);
  const double a = whole.value(), b = first.value(), c = reversed.value();
  CHECK(std::memcmp(&a, &b, sizeof(double)) == 0);
  CHECK(std::memcmp(&a, &c, sizeof(double)) == 0);
  long double real = 0;
  for (std::size_t i = 0; i + 4 < x.size(); ++i) real += static_cast<long double>(x[i]);
  CHECK(std::fabs(a - static_cast<double>(real)) <= std::fabs(static_cast<double>(real)) * 1e-15);

  exact::double_sum negative;
  negative.add(-2.5);
  negative.add(0.25);
  CHECK(negative.value() == -2.25);
  exact::double_sum with_inf;
  with_inf.add(1.0);
  with_inf.add(std::numeric_limits<double>::infinity());
  CHECK(std::isnan(with_inf.value()));
}

}  // namespace policy_reduction_test
