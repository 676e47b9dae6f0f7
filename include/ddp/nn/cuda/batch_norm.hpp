#pragma once
// Batch normalisation on a GPU: the behaviour and the arithmetic of ddp::nn::batch_norm
// (PyTorch's BatchNorm1d; frozen mode; synchronised statistics through `reduce`), with the
// per-feature sums in double on the device. With synchronised statistics `reduce` sums them over
// the ranks where they are: in place on the GPU with NCCL (ddp/nn/cuda/sync.hpp).
#include <functional>
#include <span>
#include <stdexcept>
#include <vector>

#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/nn/cuda/matrix.hpp"
#include "ddp/nn/cuda/parameter.hpp"
#include "ddp/nn/layer.hpp"

namespace ddp::nn::cuda {

class batch_norm {
 public:
  using matrix_type = matrix;
  enum class mode { batch_statistics, frozen };

  batch_norm(ddp::cuda::device& dev, std::size_t features, float momentum = 0.1f, float eps = 1e-5f)
      : dev_(&dev), features_(features), momentum_(momentum), eps_(eps),
        running_mean_(dev, "running_mean", features, 0.0f), running_var_(dev, "running_var", features, 1.0f),
        batches_tracked_(dev, "num_batches_tracked", 1, 0) {
    params_.emplace_back(dev, "weight", shape_t{static_cast<std::int64_t>(features)}, std::vector<float>(features, 1.0f));
    params_.emplace_back(dev, "bias", shape_t{static_cast<std::int64_t>(features)}, std::vector<float>(features, 0.0f));
  }

  void set_mode(mode m) noexcept { mode_ = m; }
  // `reduce` sums a vector in this GPU's memory elementwise over every rank, in place (a
  // collective that returns once the compute stream is ordered after it).
  void synchronize_statistics(std::function<void(std::span<double>)> reduce) { reduce_ = std::move(reduce); }

  matrix forward(const matrix& x, bool training) {
    require_cols(x, features_, "batch_norm");
    const std::size_t n = x.rows(), f = features_;
    const bool batch_stats = training && mode_ == mode::batch_statistics;
    if (batch_stats && n < 2)
      throw std::invalid_argument("ddp::nn::cuda::batch_norm: training needs at least 2 samples per batch, got " +
                                  std::to_string(n));
    ddp::cuda::device_vector<float> mean(*dev_, f), inv_std(*dev_, f);
    ddp::cuda::device_vector<double> moments;  // per-feature sums and the sample count, global when synchronised
    if (batch_stats) {
      moments = ddp::cuda::device_vector<double>(*dev_, 2 * f + 1);
      run(kernels::column_moments(x.data(), n, f, moments.data(), stream()), "column_moments kernel");
      if (reduce_) reduce_(std::span<double>(moments.data(), moments.size()));
      run(kernels::batch_statistics(moments.data(), f, momentum_, eps_, mean.data(), inv_std.data(),
                                    running_mean_.write(), running_var_.write(), stream()),
          "batch_statistics kernel");
      run(kernels::add_i64(batches_tracked_.write(), 1, stream()), "add_i64 kernel");
    } else {  // frozen statistics; backward reads the variance again, checked by its version
      run(kernels::running_statistics(running_mean_.read(),
                                      training ? running_var_.read_for_backward() : running_var_.read(), f, eps_,
                                      mean.data(), inv_std.data(), stream()),
          "running_statistics kernel");
    }
    matrix xhat(*dev_, n, f), y(*dev_, n, f);
    run(kernels::normalize(x.data(), mean.data(), inv_std.data(), params_[0].value(), params_[1].value(), xhat.data(),
                           y.data(), n, f, stream()),
        "normalize kernel");
    if (training) {
      saved_.push_back(
          {std::move(xhat), batch_stats ? std::move(inv_std) : ddp::cuda::device_vector<float>{}, std::move(moments)});
    }
    return y;
  }

  matrix backward(const matrix& dy, bool need_dx) {
    auto s = ddp::nn::pop_saved(saved_, "batch_norm");
    const bool batch_stats = s.inv_std.size() != 0;
    const std::size_t n = dy.rows(), f = features_;
    ddp::cuda::device_vector<float> inv_std = std::move(s.inv_std);
    if (!batch_stats) {  // frozen: the running variance, as the forward saw it (checked by version)
      ddp::cuda::device_vector<float> unused_mean(*dev_, f);
      inv_std = ddp::cuda::device_vector<float>(*dev_, f);
      run(kernels::running_statistics(running_mean_.read(), running_var_.read(), f, eps_, unused_mean.data(),
                                      inv_std.data(), stream()),
          "running_statistics kernel");
      running_var_.release_after_backward();
    }
    ddp::cuda::device_vector<double> sums(*dev_, 2 * f);
    run(kernels::normalize_backward_sums(dy.data(), s.xhat.data(), n, f, sums.data(), params_[0].grad(),
                                         params_[1].grad(), stream()),
        "normalize_backward_sums kernel");
    if (batch_stats && reduce_) reduce_(std::span<double>(sums.data(), sums.size()));  // the global batch's, for dx
    if (!need_dx) return {};
    matrix dx(*dev_, n, f);
    const double* count = batch_stats ? s.moments.data() + 2 * f : nullptr;  // the forward's (global) count
    run(kernels::normalize_backward_input(dy.data(), s.xhat.data(), params_[0].value(), inv_std.data(), sums.data(),
                                          count, batch_stats, dx.data(), n, f, stream()),
        "normalize_backward_input kernel");
    return dx;
  }

  std::span<parameter> params() noexcept { return params_; }
  std::vector<buffer_ref> buffer_refs(const std::string& prefix) {
    return {running_mean_.ref(prefix), running_var_.ref(prefix), batches_tracked_.ref(prefix)};
  }
  // Copies to the host (waits for the stream).
  std::vector<float> running_mean() const { return running_mean_.to_host(); }
  std::vector<float> running_var() const { return running_var_.to_host(); }
  std::int64_t batches_tracked() const { return batches_tracked_.to_host()[0]; }

 private:
  struct saved {
    matrix xhat;
    ddp::cuda::device_vector<float> inv_std;  // empty when the forward used running statistics
    ddp::cuda::device_vector<double> moments;  // likewise; its last element is the forward's sample count
  };

  cudaStream_t stream() const noexcept { return dev_->stream(); }
  void run(cudaError_t status, const char* kernel) const { ddp::cuda::check(status, kernel, dev_->site()); }

  ddp::cuda::device* dev_;
  std::size_t features_;
  float momentum_, eps_;
  mode mode_ = mode::batch_statistics;
  std::vector<parameter> params_;
  buffer<float> running_mean_, running_var_;
  buffer<std::int64_t> batches_tracked_;
  std::vector<saved> saved_;
  std::function<void(std::span<double>)> reduce_;
};

}  // namespace ddp::nn::cuda
