#pragma once
// Layer normalisation on a GPU: the behaviour and the arithmetic of ddp::nn::layer_norm (the
// row's statistics in double), one thread per sample.
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/nn/cuda/matrix.hpp"
#include "ddp/nn/cuda/parameter.hpp"
#include "ddp/nn/layer.hpp"

namespace ddp::nn::cuda {

class layer_norm {
 public:
  using matrix_type = matrix;

  layer_norm(ddp::cuda::device& dev, std::size_t features, float eps = 1e-5f)
      : dev_(&dev), features_(features), eps_(eps) {
    if (features == 0) throw error("nn", "cuda::layer_norm", -1, "0 features: normalise over at least one");
    params_.emplace_back(dev, "weight", shape_t{static_cast<std::int64_t>(features)}, std::vector<float>(features, 1.0f));
    params_.emplace_back(dev, "bias", shape_t{static_cast<std::int64_t>(features)}, std::vector<float>(features, 0.0f));
  }

  matrix forward(const matrix& x, bool training) {
    require_cols(x, features_, "layer_norm");
    const std::size_t n = x.rows(), f = features_;
    matrix xhat(*dev_, n, f), y(*dev_, n, f);
    ddp::cuda::device_vector<float> inv_std(*dev_, n);
    run(kernels::layer_norm_forward(x.data(), params_[0].value(), params_[1].value(), eps_, xhat.data(), y.data(),
                                    inv_std.data(), n, f, stream()),
        "layer_norm_forward kernel");
    if (training) saved_.push_back({std::move(xhat), std::move(inv_std)});
    return y;
  }

  matrix backward(const matrix& dy, bool need_dx) {
    auto s = ddp::nn::pop_saved(saved_, "layer_norm");
    require_cols(dy, features_, "layer_norm backward");
    const std::size_t n = dy.rows(), f = features_;
    ddp::cuda::device_vector<double> sums(*dev_, 2 * f);  // per feature: sum dy, sum dy * xhat
    run(kernels::normalize_backward_sums(dy.data(), s.xhat.data(), n, f, sums.data(), params_[0].grad(),
                                         params_[1].grad(), stream()),
        "normalize_backward_sums kernel");
    if (!need_dx) return {};
    matrix dx(*dev_, n, f);
    run(kernels::layer_norm_backward_input(dy.data(), s.xhat.data(), params_[0].value(), s.inv_std.data(), dx.data(),
                                           n, f, stream()),
        "layer_norm_backward_input kernel");
    return dx;
  }

  std::span<parameter> params() noexcept { return params_; }
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }

 private:
  struct saved {
    matrix xhat;
    ddp::cuda::device_vector<float> inv_std;  // per row
  };
  cudaStream_t stream() const noexcept { return dev_->stream(); }
  void run(cudaError_t status, const char* kernel) const { ddp::cuda::check(status, kernel, dev_->site()); }

  ddp::cuda::device* dev_;
  std::size_t features_;
  float eps_;
  std::vector<parameter> params_;
  std::vector<saved> saved_;
};

}  // namespace ddp::nn::cuda
