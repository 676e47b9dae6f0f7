#pragma once
// The exact (erf) GELU on a GPU, computed as ddp::nn::gelu computes it.
#include <string>
#include <vector>

#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/nn/cuda/matrix.hpp"
#include "ddp/nn/cuda/parameter.hpp"
#include "ddp/nn/layer.hpp"

namespace ddp::nn::cuda {

class gelu {
 public:
  using matrix_type = matrix;

  matrix forward(const matrix& x, bool training) {
    matrix y(x.device(), x.rows(), x.cols());
    ddp::cuda::check(kernels::gelu_forward(x.data(), y.data(), x.size(), x.device().stream()), "gelu_forward kernel",
                     x.device().site());
    if (training) saved_.push_back(x);
    return y;
  }
  matrix backward(const matrix& dy, bool need_dx) {
    const matrix x = ddp::nn::pop_saved(saved_, "gelu");
    if (!need_dx) return {};
    matrix dx(dy.device(), dy.rows(), dy.cols());
    ddp::cuda::check(kernels::gelu_backward(x.data(), dy.data(), dx.data(), dy.size(), dy.device().stream()),
                     "gelu_backward kernel", dy.device().site());
    return dx;
  }
  std::span<parameter> params() noexcept { return {}; }
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }

 private:
  std::vector<matrix> saved_;
};

}  // namespace ddp::nn::cuda
