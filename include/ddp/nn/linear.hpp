#pragma once
// y = x W^T + b, with W [out, in] and b [out] initialised as PyTorch's nn.Linear does
// (uniform in +-1/sqrt(in)), from a seed so every rank can start from the same weights.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/random.hpp"
#include "ddp/nn/blas.hpp"
#include "ddp/nn/layer.hpp"
#include "ddp/nn/saved_stack.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::nn {

// PyTorch's nn.Linear initialisation, from `seed`: the same numbers on every device.
inline void initialise_linear(std::size_t in, std::span<float> weight, std::span<float> bias, std::uint64_t seed) {
  splitmix64 rng(seed);
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));
  for (auto& w : weight) w = rng.uniform(-bound, bound);
  for (auto& b : bias) b = rng.uniform(-bound, bound);
}

class linear {
 public:
  linear(std::size_t in, std::size_t out, std::uint64_t seed);

  using matrix_type = matrix;

  matrix forward(const matrix& x, bool training);
  // The same, keeping x's own storage for backward instead of a copy of it (x is left holding
  // storage of unspecified contents).
  matrix forward(matrix&& x, bool training);

  matrix backward(const matrix& dy, bool need_dx);

  std::span<parameter> params() noexcept { return params_; }
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }
  std::size_t in_features() const noexcept { return in_; }
  std::size_t out_features() const noexcept { return out_; }

 private:
  std::size_t in_, out_;
  std::vector<parameter> params_;
  saved_stack<matrix> saved_;  // the inputs of training forwards

  matrix affine(const matrix& x) const;
};

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE linear::linear(std::size_t in, std::size_t out, std::uint64_t seed) : in_(in), out_(out) {
  blas::use_one_thread_per_rank();
  params_.emplace_back("weight", shape_t{static_cast<std::int64_t>(out), static_cast<std::int64_t>(in)});
  params_.emplace_back("bias", shape_t{static_cast<std::int64_t>(out)});
  initialise_linear(in, params_[0].value(), params_[1].value(), seed);
}

DDP_RUNTIME_INLINE matrix linear::affine(const matrix& x) const {
  require_cols(x, in_, "linear");
  // y starts as the bias in every row, written once (no zero fill first).
  matrix y;
  y.rows = x.rows;
  y.cols = out_;
  y.data.reserve(x.rows * out_);
  const float* b = params_[1].value().data();
  for (std::size_t r = 0; r < y.rows; ++r) y.data.insert(y.data.end(), b, b + out_);
  blas::gemm(false, true, x.rows, out_, in_, 1.0f, x.data.data(), in_, params_[0].value().data(), in_,
             1.0f, y.data.data(), out_);
  return y;
}

DDP_RUNTIME_INLINE matrix linear::forward(const matrix& x, bool training) {
  matrix y = affine(x);
  if (training) saved_.push_copy(x);
  return y;
}

DDP_RUNTIME_INLINE matrix linear::forward(matrix&& x, bool training) {
  matrix y = affine(x);
  if (training) saved_.push_swap(x);
  return y;
}

DDP_RUNTIME_INLINE matrix linear::backward(const matrix& dy, bool need_dx) {
  auto saved = saved_.pop("linear");
  const matrix& x = *saved;
  require_cols(dy, out_, "linear backward");
  if (dy.rows != x.rows)
    throw std::invalid_argument("ddp::nn: linear backward expects " + std::to_string(x.rows) +
                                " rows of gradient (its forward's), got " + std::to_string(dy.rows));
  // dW += dy^T x ; db += column sums of dy ; dx = dy W
  blas::gemm(true, false, out_, in_, x.rows, 1.0f, dy.data.data(), out_, x.data.data(), in_, 1.0f,
             params_[0].grad().data(), in_);
  float* db = params_[1].grad().data();
  for (std::size_t r = 0; r < dy.rows; ++r) {
    const float* d = dy.row(r);
    for (std::size_t c = 0; c < out_; ++c) db[c] += d[c];
  }
  if (!need_dx) return {};
  // dx has x's shape, and x is done with: dx takes its storage (the product overwrites it).
  matrix dx = std::exchange(*saved, matrix{});
  blas::gemm(false, false, dy.rows, in_, out_, 1.0f, dy.data.data(), out_, params_[0].value().data(), in_,
             0.0f, dx.data.data(), in_);
  return dx;
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::nn
