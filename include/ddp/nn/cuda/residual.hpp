#pragma once
// ddp::nn::residual over GPU layers: the same combinator, its skip path added by a kernel.
//
//   ddp::nn::residual block(ddp::nn::cuda::layer_norm(dev, 256), ddp::nn::cuda::linear(dev, 256, 256, seed),
//                           ddp::nn::cuda::gelu());
#include "ddp/cuda/check.hpp"
#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/nn/cuda/matrix.hpp"
#include "ddp/nn/residual.hpp"

namespace ddp::nn::cuda {

// y += x, elementwise, on y's device (the residual's skip path).
inline void add_into(matrix& y, const matrix& x) {
  ddp::cuda::check(kernels::add(y.data(), x.data(), y.size(), y.device().stream()), "add kernel", y.device().site());
}

}  // namespace ddp::nn::cuda
