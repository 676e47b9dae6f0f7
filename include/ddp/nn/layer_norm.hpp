#pragma once
// Layer normalisation over the features of each sample, as PyTorch's nn.LayerNorm(features):
// y = (x - mean) / sqrt(var + eps) * weight + bias, with the mean and the biased variance of
// the sample's own row (in double), weight starting at 1 and bias at 0. No batch statistics and
// no buffers: a sample's output depends on that sample alone, on any number of ranks.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/nn/layer.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::nn {

class layer_norm {
 public:
  using matrix_type = matrix;

  explicit layer_norm(std::size_t features, float eps = 1e-5f);

  matrix forward(const matrix& x, bool training);

  // With dh = dy * weight: dx = inv_std * (dh - mean(dh) - xhat * mean(dh * xhat)), per row.
  matrix backward(const matrix& dy, bool need_dx);

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
  std::vector<saved> saved_;
};

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
  matrix xhat(n, f), y(n, f);
  std::vector<float> inv_std(n);
  const float* g = params_[0].value().data();
  const float* b = params_[1].value().data();
  for (std::size_t r = 0; r < n; ++r) {
    const float* xr = x.row(r);
    double sum = 0.0, sq = 0.0;
    for (std::size_t c = 0; c < f; ++c) sum += xr[c];
    const double mean = sum / static_cast<double>(f);
    for (std::size_t c = 0; c < f; ++c) sq += (xr[c] - mean) * (xr[c] - mean);
    const double is = 1.0 / std::sqrt(sq / static_cast<double>(f) + eps_);
    inv_std[r] = static_cast<float>(is);
    for (std::size_t c = 0; c < f; ++c) {
      xhat(r, c) = static_cast<float>((xr[c] - mean) * is);
      y(r, c) = xhat(r, c) * g[c] + b[c];
    }
  }
  if (training) saved_.push_back({std::move(xhat), std::move(inv_std)});
  return y;
}

DDP_RUNTIME_INLINE matrix layer_norm::backward(const matrix& dy, bool need_dx) {
  const auto s = pop_saved(saved_, "layer_norm");
  require_cols(dy, features_, "layer_norm backward");
  const std::size_t n = dy.rows, f = features_;
  float* dg = params_[0].grad().data();
  float* db = params_[1].grad().data();
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t c = 0; c < f; ++c) {
      dg[c] += dy(r, c) * s.xhat(r, c);
      db[c] += dy(r, c);
    }
  if (!need_dx) return {};
  const float* g = params_[0].value().data();
  matrix dx(n, f);
  for (std::size_t r = 0; r < n; ++r) {
    double mean_dh = 0.0, mean_dh_xhat = 0.0;
    for (std::size_t c = 0; c < f; ++c) {
      const double dh = static_cast<double>(dy(r, c)) * g[c];
      mean_dh += dh;
      mean_dh_xhat += dh * s.xhat(r, c);
    }
    mean_dh /= static_cast<double>(f);
    mean_dh_xhat /= static_cast<double>(f);
    for (std::size_t c = 0; c < f; ++c) {
      const double dh = static_cast<double>(dy(r, c)) * g[c];
      dx(r, c) = static_cast<float>(s.inv_std[r] * (dh - mean_dh - s.xhat(r, c) * mean_dh_xhat));
    }
  }
  return dx;
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::nn
