#pragma once
// Batch normalisation over the batch dimension, as PyTorch's BatchNorm1d:
//   training: normalise with the batch mean and (biased) variance; update the running mean and
//             the running (unbiased) variance with `momentum`; count batches.
//   frozen:   training forwards normalise with the running statistics and leave them alone
//             (fine-tuning with "bn.eval()"); backward reads running_var, so each forward saves
//             its version and a buffer overwritten in between is caught (pitfall P1).
//   evaluation (the module's training flag off): running statistics, nothing saved.
//
// By default each rank normalises with its own batch's statistics (PyTorch's BatchNorm1d under
// DDP). synchronize_statistics(reduce) makes the statistics global (PyTorch's SyncBatchNorm):
// forward and backward sum their per-feature sums over every rank with `reduce`, so N ranks
// compute exactly what one process computes on the global batch.
//   bn.synchronize_statistics(ddp::nn::sum_over_ranks(comm));
//
// Deferred running statistics (a trainer under reduction::invariant turns them on): a training
// forward records its batch's mean and unbiased variance instead of updating the running
// statistics, and apply_buffer_updates() applies the records later, in the order given. Each
// forward normalises with its own batch's statistics (ghost batch norm over the virtual shards),
// and a trainer that applies every shard's record in shard order on every rank gets running
// statistics that do not depend on how the shards were spread over ranks.
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ddp/nn/layer.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::nn {

class batch_norm {
 public:
  using matrix_type = matrix;
  enum class mode { batch_statistics, frozen };

  explicit batch_norm(std::size_t features, float momentum = 0.1f, float eps = 1e-5f);

  void set_mode(mode m) noexcept { mode_ = m; }

  // `reduce` sums a vector elementwise over every rank, in place (a blocking collective).
  void synchronize_statistics(std::function<void(std::span<double>)> reduce) { reduce_ = std::move(reduce); }

  // Deferred running statistics: a record of 2 * features floats per training forward (the
  // batch mean, then the unbiased variance).
  void defer_buffer_updates(bool on) {
    if (!on) pending_.clear();
    defer_ = on;
  }
  // Frozen, a training forward records nothing (it does not change the running statistics).
  std::size_t buffer_update_size() const noexcept { return mode_ == mode::frozen ? 0 : 2 * features_; }
  std::vector<float> take_buffer_updates() { return std::exchange(pending_, {}); }
  void apply_buffer_updates(std::span<const float> records);

  matrix forward(const matrix& x, bool training);

  matrix backward(const matrix& dy, bool need_dx);

  std::span<parameter> params() noexcept { return params_; }
  std::vector<buffer_ref> buffer_refs(const std::string& prefix) {
    return {running_mean_.ref(prefix), running_var_.ref(prefix), batches_tracked_.ref(prefix)};
  }
  std::span<const float> running_mean() const noexcept { return running_mean_.read(); }
  std::span<const float> running_var() const noexcept { return running_var_.read(); }
  std::int64_t batches_tracked() const noexcept { return batches_tracked_.read()[0]; }

 private:
  void update_running(float& mean, float& var, float batch_mean, float batch_var) const noexcept {
    mean = (1.0f - momentum_) * mean + momentum_ * batch_mean;
    var = (1.0f - momentum_) * var + momentum_ * batch_var;
  }

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
  std::vector<double> batch_count_;  // global batch size of each pending training forward
  std::function<void(std::span<double>)> reduce_;
  bool defer_ = false;
  std::vector<float> pending_;  // deferred: the records of the training forwards not yet taken
};

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE batch_norm::batch_norm(std::size_t features, float momentum, float eps)
    : features_(features), momentum_(momentum), eps_(eps), running_mean_("running_mean", features, 0.0f),
      running_var_("running_var", features, 1.0f), batches_tracked_("num_batches_tracked", 1, 0) {
  params_.emplace_back("weight", shape_t{static_cast<std::int64_t>(features)});
  params_.emplace_back("bias", shape_t{static_cast<std::int64_t>(features)});
  for (auto& g : params_[0].value()) g = 1.0f;
}

DDP_RUNTIME_INLINE void batch_norm::apply_buffer_updates(std::span<const float> records) {
  const std::size_t f = features_;
  if (records.size() % (2 * f) != 0)
    throw std::invalid_argument("ddp::nn::batch_norm: " + std::to_string(records.size()) +
                                " floats of buffer updates are not whole records of " + std::to_string(2 * f));
  if (records.empty()) return;
  auto rm = running_mean_.write();
  auto rv = running_var_.write();
  for (std::size_t k = 0; k < records.size(); k += 2 * f) {
    for (std::size_t c = 0; c < f; ++c) update_running(rm[c], rv[c], records[k + c], records[k + f + c]);
    ++batches_tracked_.write()[0];
  }
}

DDP_RUNTIME_INLINE matrix batch_norm::forward(const matrix& x, bool training) {
  require_cols(x, features_, "batch_norm");
  const std::size_t n = x.rows, f = features_;
  const bool batch_stats = training && mode_ == mode::batch_statistics;
  if (batch_stats && n < 2)
    throw std::invalid_argument("ddp::nn::batch_norm: training needs at least 2 samples per batch, got " +
                                std::to_string(n));
  std::vector<float> mean(f), inv_std(f);
  if (batch_stats) {
    // Per-feature sum and sum of squares (in double, so E[x^2] - E[x]^2 keeps its digits),
    // and the count: one vector, so synchronised statistics take one reduction.
    std::vector<double> stats(2 * f + 1, 0.0);
    for (std::size_t r = 0; r < n; ++r) {
      const float* xr = x.row(r);
      for (std::size_t c = 0; c < f; ++c) {
        stats[c] += xr[c];
        stats[f + c] += static_cast<double>(xr[c]) * xr[c];
      }
    }
    stats[2 * f] = static_cast<double>(n);
    if (reduce_ && defer_)
      throw std::logic_error(
          "ddp::nn::batch_norm: synchronize_statistics() under deferred running statistics "
          "(reduction::invariant): statistics summed over the ranks depend on the world size; each "
          "virtual shard normalises with its own statistics instead, so leave synchronize_statistics off");
    if (reduce_) reduce_(std::span<double>(stats));
    const double count = stats[2 * f];
    std::vector<float> unbiased(f);
    for (std::size_t c = 0; c < f; ++c) {
      const double m = stats[c] / count;
      const double var = std::max(0.0, stats[f + c] / count - m * m);
      mean[c] = static_cast<float>(m);
      inv_std[c] = static_cast<float>(1.0 / std::sqrt(var + eps_));
      unbiased[c] = static_cast<float>(var * count / (count - 1));
    }
    if (defer_) {
      pending_.insert(pending_.end(), mean.begin(), mean.end());
      pending_.insert(pending_.end(), unbiased.begin(), unbiased.end());
    } else {
      auto rm = running_mean_.write();
      auto rv = running_var_.write();
      for (std::size_t c = 0; c < f; ++c) update_running(rm[c], rv[c], mean[c], unbiased[c]);
      ++batches_tracked_.write()[0];
    }
    batch_count_.push_back(count);
  } else {  // frozen statistics; backward reads the variance again, checked by its version
    auto rm = running_mean_.read();
    auto rv = training ? running_var_.read_for_backward() : running_var_.read();
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
    saved_.push_back({std::move(xhat), batch_stats ? std::move(inv_std) : std::vector<float>{}});
  }
  return y;
}

DDP_RUNTIME_INLINE matrix batch_norm::backward(const matrix& dy, bool need_dx) {
  auto s = pop_saved(saved_, "batch_norm");
  const bool batch_stats = !s.inv_std.empty();
  std::vector<float> inv_std = std::move(s.inv_std);
  if (!batch_stats) {  // frozen: the running variance, as the forward saw it (checked by version)
    inv_std.resize(features_);
    auto rv = running_var_.read();
    for (std::size_t c = 0; c < features_; ++c) inv_std[c] = 1.0f / std::sqrt(rv[c] + eps_);
    running_var_.release_after_backward();
  }
  const std::size_t n = dy.rows, f = features_;
  std::vector<double> sums(2 * f, 0.0);  // sum of dy, then sum of dy * xhat, per feature
  for (std::size_t r = 0; r < n; ++r) {
    const float* d = dy.row(r);
    const float* h = s.xhat.row(r);
    for (std::size_t c = 0; c < f; ++c) {
      sums[c] += d[c];
      sums[f + c] += static_cast<double>(d[c]) * h[c];
    }
  }
  float* dg = params_[0].grad().data();
  float* db = params_[1].grad().data();
  for (std::size_t c = 0; c < f; ++c) {
    dg[c] += static_cast<float>(sums[f + c]);
    db[c] += static_cast<float>(sums[c]);
  }
  double count = static_cast<double>(n);
  if (batch_stats) {
    count = pop_saved(batch_count_, "batch_norm");
    if (reduce_) reduce_(std::span<double>(sums));  // the global batch's sums, for dx
  }
  const double* sum_dy = sums.data();
  const double* sum_dy_xhat = sums.data() + f;
  if (!need_dx) return {};
  const float* g = params_[0].value().data();
  matrix dx(n, f);
  for (std::size_t r = 0; r < n; ++r) {
    const float* d = dy.row(r);
    const float* h = s.xhat.row(r);
    float* o = dx.row(r);
    for (std::size_t c = 0; c < f; ++c) {
      if (batch_stats) {
        const double mean_dy = sum_dy[c] / count;
        const double mean_dy_xhat = sum_dy_xhat[c] / count;
        o[c] = static_cast<float>(g[c] * inv_std[c] * (d[c] - mean_dy - h[c] * mean_dy_xhat));
      } else {
        o[c] = d[c] * g[c] * inv_std[c];
      }
    }
  }
  return dx;
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::nn
