#pragma once
// y = x W^T + b on a GPU (cuBLAS), initialised exactly as ddp::nn::linear from the same seed.
#include <vector>

#include "ddp/cuda/blas.hpp"
#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/nn/cuda/matrix.hpp"
#include "ddp/nn/cuda/parameter.hpp"
#include "ddp/nn/layer.hpp"
#include "ddp/nn/linear.hpp"

namespace ddp::nn::cuda {

class linear {
 public:
  using matrix_type = matrix;

  linear(ddp::cuda::device& dev, std::size_t in, std::size_t out, std::uint64_t seed) : dev_(&dev), in_(in), out_(out) {
    std::vector<float> w(in * out), b(out);
    ddp::nn::initialise_linear(in, w, b, seed);
    params_.emplace_back(dev, "weight", shape_t{static_cast<std::int64_t>(out), static_cast<std::int64_t>(in)}, w);
    params_.emplace_back(dev, "bias", shape_t{static_cast<std::int64_t>(out)}, b);
  }

  matrix forward(const matrix& x, bool training) {
    require_cols(x, in_, "linear");
    matrix y(*dev_, x.rows(), out_);
    ddp::cuda::check(kernels::fill_rows(y.data(), params_[1].value(), y.rows(), out_, dev_->stream()),
                     "fill_rows kernel", dev_->site());
    ddp::cuda::blas::gemm(*dev_, false, true, x.rows(), out_, in_, 1.0f, x.data(), in_, params_[0].value(), in_, 1.0f,
                          y.data(), out_);
    if (training) saved_.push_back(x);
    return y;
  }

  matrix backward(const matrix& dy, bool need_dx) {
    const matrix x = ddp::nn::pop_saved(saved_, "linear");
    require_cols(dy, out_, "linear backward");
    // dW += dy^T x ; db += column sums of dy ; dx = dy W
    ddp::cuda::blas::gemm(*dev_, true, false, out_, in_, x.rows(), 1.0f, dy.data(), out_, x.data(), in_, 1.0f,
                          params_[0].grad(), in_);
    ddp::cuda::check(kernels::add_column_sums(params_[1].grad(), dy.data(), dy.rows(), out_, dev_->stream()),
                     "add_column_sums kernel", dev_->site());
    if (!need_dx) return {};
    matrix dx(*dev_, dy.rows(), in_);
    ddp::cuda::blas::gemm(*dev_, false, false, dy.rows(), in_, out_, 1.0f, dy.data(), out_, params_[0].value(), in_,
                          0.0f, dx.data(), in_);
    return dx;
  }

  std::span<parameter> params() noexcept { return params_; }
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }

 private:
  ddp::cuda::device* dev_;
  std::size_t in_, out_;
  std::vector<parameter> params_;
  std::vector<matrix> saved_;
};

}  // namespace ddp::nn::cuda
