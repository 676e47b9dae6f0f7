#pragma once
// Batch normalisation over the batch dimension, as PyTorch's BatchNorm1d:
//   training: normalise with the batch mean and (biased) variance; update the running mean and
//             the running (unbiased) variance with `momentum`; count batches.
//   frozen:   training forwards normalise with the running statistics and leave them alone
//             (fine-tuning with "bn.eval()"); backward reads running_var, so each forward saves
//             its version and a buffer overwritten in between is caught (pitfall P1).
//   evaluation (the module's training flag off): running statistics, nothing saved.
#include <cmath>
#include <cstdint>
#include <vector>

#include "ddp/nn/layer.hpp"

namespace ddp::nn {

class batch_norm {
 public:
  enum class mode { batch_statistics, frozen };

  explicit batch_norm(std::size_t features, float momentum = 0.1f, float eps = 1e-5f)
      : features_(features), momentum_(momentum), eps_(eps), running_mean_("running_mean", features, 0.0f),
        running_var_("running_var", features, 1.0f), batches_tracked_("num_batches_tracked", 1, 0) {
    params_.emplace_back("weight", shape_t{static_cast<std::int64_t>(features)});
    params_.emplace_back("bias", shape_t{static_cast<std::int64_t>(features)});
    for (auto& g : params_[0].value()) g = 1.0f;
  }

  void set_mode(mode m) noexcept { mode_ = m; }

  matrix forward(const matrix& x, bool training) {
    require_cols(x, features_, "batch_norm");
    const std::size_t n = x.rows, f = features_;
    const bool batch_stats = training && mode_ == mode::batch_statistics;
    if (batch_stats && n < 2)
      throw std::invalid_argument("ddp::nn::batch_norm: training needs at least 2 samples per batch, got " +
                                  std::to_string(n));
    std::vector<float> mean(f), inv_std(f);
    if (batch_stats) {
      std::vector<double> sum(f, 0.0), sq(f, 0.0);
      for (std::size_t r = 0; r < n; ++r) {
        const float* xr = x.row(r);
        for (std::size_t c = 0; c < f; ++c) sum[c] += xr[c];
      }
      for (std::size_t c = 0; c < f; ++c) mean[c] = static_cast<float>(sum[c] / static_cast<double>(n));
      for (std::size_t r = 0; r < n; ++r) {
        const float* xr = x.row(r);
        for (std::size_t c = 0; c < f; ++c) {
          const double d = xr[c] - mean[c];
          sq[c] += d * d;
        }
      }
      auto rm = running_mean_.data();
      auto rv = running_var_.data();
      for (std::size_t c = 0; c < f; ++c) {
        const double var = sq[c] / static_cast<double>(n);
        inv_std[c] = static_cast<float>(1.0 / std::sqrt(var + eps_));
        rm[c] = (1.0f - momentum_) * rm[c] + momentum_ * mean[c];
        rv[c] = (1.0f - momentum_) * rv[c] +
                momentum_ * static_cast<float>(sq[c] / static_cast<double>(n - 1));
      }
      running_mean_.version().bump();
      running_var_.version().bump();
      ++batches_tracked_.data()[0];
      batches_tracked_.version().bump();
    } else {
      auto rm = running_mean_.data();
      auto rv = running_var_.data();
      for (std::size_t c = 0; c < f; ++c) {
        mean[c] = rm[c];
        inv_std[c] = 1.0f / std::sqrt(rv[c] + eps_);
      }
    }
    matrix xhat(n, f), y(n, f);
    const float* g = params_[0].value().data();
    const float* b = params_[1].value().data();
    for (std::size_t r = 0; r < n; ++r) {
      const float* xr = x.row(r);
      float* hr = xhat.row(r);
      float* yr = y.row(r);
      for (std::size_t c = 0; c < f; ++c) {
        hr[c] = (xr[c] - mean[c]) * inv_std[c];
        yr[c] = hr[c] * g[c] + b[c];
      }
    }
    if (training) {
      if (!batch_stats) running_var_.version().save_for_backward();
      saved_.push_back({std::move(xhat), batch_stats ? std::move(inv_std) : std::vector<float>{}});
    }
    return y;
  }

  matrix backward(const matrix& dy, bool need_dx) {
    auto s = pop_saved(saved_, "batch_norm");
    const bool batch_stats = !s.inv_std.empty();
    std::vector<float> inv_std = std::move(s.inv_std);
    if (!batch_stats) {  // frozen: the running variance, as the forward saw it (checked by version)
      running_var_.version().release_saved();
      inv_std.resize(features_);
      auto rv = running_var_.data();
      for (std::size_t c = 0; c < features_; ++c) inv_std[c] = 1.0f / std::sqrt(rv[c] + eps_);
    }
    const std::size_t n = dy.rows, f = features_;
    std::vector<double> sum_dy(f, 0.0), sum_dy_xhat(f, 0.0);
    for (std::size_t r = 0; r < n; ++r) {
      const float* d = dy.row(r);
      const float* h = s.xhat.row(r);
      for (std::size_t c = 0; c < f; ++c) {
        sum_dy[c] += d[c];
        sum_dy_xhat[c] += static_cast<double>(d[c]) * h[c];
      }
    }
    float* dg = params_[0].grad().data();
    float* db = params_[1].grad().data();
    for (std::size_t c = 0; c < f; ++c) {
      dg[c] += static_cast<float>(sum_dy_xhat[c]);
      db[c] += static_cast<float>(sum_dy[c]);
    }
    if (!need_dx) return {};
    const float* g = params_[0].value().data();
    matrix dx(n, f);
    for (std::size_t r = 0; r < n; ++r) {
      const float* d = dy.row(r);
      const float* h = s.xhat.row(r);
      float* o = dx.row(r);
      for (std::size_t c = 0; c < f; ++c) {
        if (batch_stats) {
          const double mean_dy = sum_dy[c] / static_cast<double>(n);
          const double mean_dy_xhat = sum_dy_xhat[c] / static_cast<double>(n);
          o[c] = static_cast<float>(g[c] * inv_std[c] * (d[c] - mean_dy - h[c] * mean_dy_xhat));
        } else {
          o[c] = d[c] * g[c] * inv_std[c];
        }
      }
    }
    return dx;
  }

  std::span<parameter> params() noexcept { return params_; }
  std::vector<buffer_ref> buffer_refs(const std::string& prefix) {
    return {running_mean_.ref(prefix), running_var_.ref(prefix), batches_tracked_.ref(prefix)};
  }
  std::span<const float> running_mean() const noexcept { return running_mean_.data(); }
  std::span<const float> running_var() const noexcept { return running_var_.data(); }
  std::int64_t batches_tracked() const noexcept { return batches_tracked_.data()[0]; }

 private:
  struct saved {
    matrix xhat;
    std::vector<float> inv_std;  // empty when the forward used running statistics
  };
  std::size_t features_;
  float momentum_, eps_;
  mode mode_ = mode::batch_statistics;
  std::vector<parameter> params_;
  buffer<float> running_mean_, running_var_;
  buffer<std::int64_t> batches_tracked_;
  std::vector<saved> saved_;
};

}  // namespace ddp::nn
