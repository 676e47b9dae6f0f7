#pragma once
// Inverted dropout: in training each element is zeroed with probability p and the rest scaled
// by 1/(1-p). The mask comes from (seed, rank, forward count), so ranks draw different masks and
// a rerun draws the same ones. Under reduction::invariant the trainer keys the draws instead
// (set_random_stream: the step and the virtual shard), so a shard's mask is the same on whichever
// rank runs it, at any world size.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/core/random.hpp"
#include "ddp/nn/layer.hpp"

namespace ddp::nn {

class dropout {
 public:
  using matrix_type = matrix;
  dropout(float p, std::uint64_t seed, int rank) : p_(p), seed_(seed), rank_(rank) {
    if (!(p >= 0.0f && p < 1.0f))
      throw std::invalid_argument("ddp::nn::dropout: p must be in [0, 1), got " + std::to_string(p));
  }

  // From now on the masks come from (seed, stream, forward count within the stream).
  void set_random_stream(std::uint64_t stream) noexcept {
    stream_ = stream;
    keyed_ = true;
    forwards_ = 0;
  }

  matrix forward(const matrix& x, bool training) {
    if (!training || p_ == 0.0f) {
      if (training) masks_.emplace_back();
      return x;
    }
    const std::uint64_t key = keyed_ ? splitmix64(stream_ ^ 0x6a09e667f3bcc909ull).next() : static_cast<std::uint64_t>(rank_) << 40;
    splitmix64 rng(seed_ ^ key ^ (forwards_++ * 0x9e3779b97f4a7c15ull));
    const float keep = 1.0f / (1.0f - p_);
    std::vector<float> mask(x.size());
    for (auto& m : mask) m = rng.uniform(0.0f, 1.0f) < p_ ? 0.0f : keep;
    matrix y = x;
    for (std::size_t i = 0; i < y.size(); ++i) y.data[i] *= mask[i];
    masks_.push_back(std::move(mask));
    return y;
  }
  matrix backward(const matrix& dy, bool need_dx) {
    const auto mask = pop_saved(masks_, "dropout");
    if (!need_dx) return {};
    matrix dx = dy;
    if (!mask.empty())
      for (std::size_t i = 0; i < dx.size(); ++i) dx.data[i] *= mask[i];
    return dx;
  }
  std::span<parameter> params() noexcept { return {}; }
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }

 private:
  float p_;
  std::uint64_t seed_;
  int rank_;
  std::uint64_t forwards_ = 0;
  std::uint64_t stream_ = 0;
  bool keyed_ = false;
  std::vector<std::vector<float>> masks_;
};

}  // namespace ddp::nn
