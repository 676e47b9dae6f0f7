#pragma once
// Layer normalisation over the features of each sample, as PyTorch's nn.LayerNorm(features):
// y = (x - mean) / sqrt(var + eps) * weight + bias, with the mean and the biased variance of
// the sample's own row, weight starting at 1 and bias at 0. No batch statistics and no buffers:
// a sample's output depends on that sample alone, on any number of ranks. Computed in f32 by
// vectorised loops, a row's sums over a fixed set of lanes (ddp/host/vector_math.hpp), the
// variance from the deviations from the mean (two passes).
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/vectorize.hpp"
#include "ddp/host/vector_math.hpp"
#include "ddp/nn/layer.hpp"
#include "ddp/nn/saved_stack.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::nn {

class layer_norm {
 public:
  using matrix_type = matrix;

  explicit layer_norm(std::size_t features, float eps = 1e-5f);

  matrix forward(const matrix& x, bool training);

  // With dh = dy * weight: dx = inv_std * (dh - mean(dh) - xhat * mean(dh * xhat)), per row.
  matrix backward(const matrix& dy, bool need_dx);
  // The same, dx in dy's own storage: no new matrix.
  matrix backward(matrix&& dy, bool need_dx);

  std::span<parameter> params() noexcept { return params_; }
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }

 private:
  struct saved {
    matrix xhat;
    std::vector<float> inv_std;  // per row
  };
  std::size_t features_;
  float eps_;
  std::vector<parameter> params_;
  saved_stack<saved> saved_;

  // The saved forward for a gradient of dy's shape, popped; an error naming the shapes if not.
  saved_stack<saved>::entry pop_for(const matrix& dy);
};

namespace detail {
#if DDP_RUNTIME_DEFINITIONS
// Row by row over rows x f: xhat = (x - mean) * inv_std, y = xhat * g + b.
DDP_VECTORIZE DDP_WIDE_VECTORS DDP_EXACT_FLOATS DDP_RUNTIME_INLINE void layer_norm_rows(
    const float* DDP_RESTRICT x, const float* DDP_RESTRICT g, const float* DDP_RESTRICT b, std::size_t rows,
    std::size_t f, float eps, float* DDP_RESTRICT xhat, float* DDP_RESTRICT y, float* DDP_RESTRICT inv_std) noexcept {
  const float inv_f = 1.0f / static_cast<float>(f);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * f;
    float* hr = xhat + r * f;
    float* yr = y + r * f;
    const float mean = host::lane_sum(f, [&](std::size_t c) { return xr[c]; }) * inv_f;
    const float var = host::lane_sum(f, [&](std::size_t c) { return (xr[c] - mean) * (xr[c] - mean); }) * inv_f;
    const float is = 1.0f / std::sqrt(var + eps);
    inv_std[r] = is;
    for (std::size_t c = 0; c < f; ++c) {
      hr[c] = (xr[c] - mean) * is;
      yr[c] = hr[c] * g[c] + b[c];
    }
  }
}

// dg += sum over rows of dy * xhat, db += sum over rows of dy, and (dx not null) per row, with
// dh = dy * g: dx = inv_std * (dh - mean(dh) - xhat * mean(dh * xhat)).
DDP_VECTORIZE DDP_WIDE_VECTORS DDP_EXACT_FLOATS DDP_RUNTIME_INLINE void layer_norm_rows_backward(
    const float* DDP_RESTRICT dy, const float* DDP_RESTRICT xhat, const float* DDP_RESTRICT inv_std,
    const float* DDP_RESTRICT g, std::size_t rows, std::size_t f, float* DDP_RESTRICT dg, float* DDP_RESTRICT db,
    float* DDP_RESTRICT dx) noexcept {
  const float inv_f = 1.0f / static_cast<float>(f);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * f;
    const float* hr = xhat + r * f;
    for (std::size_t c = 0; c < f; ++c) {
      dg[c] += dyr[c] * hr[c];
      db[c] += dyr[c];
    }
    if (!dx) continue;
    const float mean_dh = host::lane_sum(f, [&](std::size_t c) { return dyr[c] * g[c]; }) * inv_f;
    const float mean_dh_xhat = host::lane_sum(f, [&](std::size_t c) { return dyr[c] * g[c] * hr[c]; }) * inv_f;
    float* dxr = dx + r * f;
    for (std::size_t c = 0; c < f; ++c) dxr[c] = inv_std[r] * ((dyr[c] * g[c] - mean_dh) - hr[c] * mean_dh_xhat);
  }
}
// The same with dx in dy's place (dx = dy on return).
DDP_VECTORIZE DDP_WIDE_VECTORS DDP_EXACT_FLOATS DDP_RUNTIME_INLINE void layer_norm_rows_backward_in_place(
    float* DDP_RESTRICT dy, const float* DDP_RESTRICT xhat, const float* DDP_RESTRICT inv_std,
    const float* DDP_RESTRICT g, std::size_t rows, std::size_t f, float* DDP_RESTRICT dg,
    float* DDP_RESTRICT db) noexcept {
  const float inv_f = 1.0f / static_cast<float>(f);
  for (std::size_t r = 0; r < rows; ++r) {
    float* dyr = dy + r * f;
    const float* hr = xhat + r * f;
    for (std::size_t c = 0; c < f; ++c) {
      dg[c] += dyr[c] * hr[c];
      db[c] += dyr[c];
    }
    const float mean_dh = host::lane_sum(f, [&](std::size_t c) { return dyr[c] * g[c]; }) * inv_f;
    const float mean_dh_xhat = host::lane_sum(f, [&](std::size_t c) { return dyr[c] * g[c] * hr[c]; }) * inv_f;
    for (std::size_t c = 0; c < f; ++c) dyr[c] = inv_std[r] * ((dyr[c] * g[c] - mean_dh) - hr[c] * mean_dh_xhat);
  }
}
#else  // compiled in libddp_runtime (ddp/core/compiled_runtime.hpp)
void layer_norm_rows(const float* x, const float* g, const float* b, std::size_t rows, std::size_t f, float eps,
                     float* xhat, float* y, float* inv_std) noexcept;
void layer_norm_rows_backward(const float* dy, const float* xhat, const float* inv_std, const float* g,
                              std::size_t rows, std::size_t f, float* dg, float* db, float* dx) noexcept;
void layer_norm_rows_backward_in_place(float* dy, const float* xhat, const float* inv_std, const float* g,
                                       std::size_t rows, std::size_t f, float* dg, float* db) noexcept;
#endif
}  // namespace detail

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE layer_norm::layer_norm(std::size_t features, float eps) : features_(features), eps_(eps) {
  if (features == 0) throw error("nn", "layer_norm", -1, "0 features: normalise over at least one");
  params_.emplace_back("weight", shape_t{static_cast<std::int64_t>(features)});
  params_.emplace_back("bias", shape_t{static_cast<std::int64_t>(features)});
  for (auto& g : params_[0].value()) g = 1.0f;
}

DDP_RUNTIME_INLINE matrix layer_norm::forward(const matrix& x, bool training) {
  require_cols(x, features_, "layer_norm");
  const std::size_t n = x.rows, f = features_;
  matrix y(n, f);
  saved scratch;
  saved& s = training ? saved_.push() : scratch;
  reshape(s.xhat, n, f);
  s.inv_std.resize(n);
  detail::layer_norm_rows(x.data.data(), params_[0].value().data(), params_[1].value().data(), n, f, eps_,
                          s.xhat.data.data(), y.data.data(), s.inv_std.data());
  return y;
}

DDP_RUNTIME_INLINE saved_stack<layer_norm::saved>::entry layer_norm::pop_for(const matrix& dy) {
  if (!saved_.empty()) {  // else pop names the missing forward
    require_cols(dy, features_, "layer_norm backward");
    if (dy.rows != saved_.back().xhat.rows)
      throw std::invalid_argument("ddp::nn: layer_norm backward expects " + std::to_string(saved_.back().xhat.rows) +
                                  " rows of gradient (its forward's), got " + std::to_string(dy.rows));
  }
  return saved_.pop("layer_norm");
}

DDP_RUNTIME_INLINE matrix layer_norm::backward(const matrix& dy, bool need_dx) {
  const auto s = pop_for(dy);
  matrix dx(need_dx ? dy.rows : 0, need_dx ? features_ : 0);
  detail::layer_norm_rows_backward(dy.data.data(), s->xhat.data.data(), s->inv_std.data(), params_[0].value().data(),
                                   dy.rows, features_, params_[0].grad().data(), params_[1].grad().data(),
                                   need_dx ? dx.data.data() : nullptr);
  return dx;
}

DDP_RUNTIME_INLINE matrix layer_norm::backward(matrix&& dy, bool need_dx) {
  if (!need_dx) return backward(static_cast<const matrix&>(dy), false);
  const auto s = pop_for(dy);
  detail::layer_norm_rows_backward_in_place(dy.data.data(), s->xhat.data.data(), s->inv_std.data(),
                                            params_[0].value().data(), dy.rows, features_, params_[0].grad().data(),
                                            params_[1].grad().data());
  return std::move(dy);
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::nn
