#pragma once
// splitmix64: a small generator specified bit for bit, so seeded orders and initial weights are
// the same on every platform and standard library.
#include <cmath>
#include <cstdint>

namespace ddp {

class splitmix64 {
 public:
  explicit splitmix64(std::uint64_t seed) noexcept : state_(seed) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound), without modulo bias.
  std::uint64_t below(std::uint64_t bound) noexcept {
    const std::uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    std::uint64_t r;
    do r = next();
    while (r >= limit);
    return r % bound;
  }
  // Uniform in [lo, hi). A draw that rounds up to hi in float (about one in 2^25 for [0, 1))
  // becomes the float just below hi; every other draw keeps its bits.
  float uniform(float lo, float hi) noexcept {
    const float x = lo + (hi - lo) * static_cast<float>(static_cast<double>(next() >> 11) * 0x1.0p-53);
    return x < hi ? x : std::nextafter(hi, lo);
  }

 private:
  std::uint64_t state_;
};

}  // namespace ddp
