#pragma once
// GELU, exact: y = x * Phi(x) = x/2 * (1 + erf(x / sqrt 2)), PyTorch's nn.GELU() (its default,
// approximate='none'; not the tanh approximation). dy/dx = Phi(x) + x * phi(x), phi the normal
// density.
#include <cmath>
#include <string>
#include <vector>

#include "ddp/nn/layer.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::nn {

namespace detail {
inline float gelu(float x) noexcept {
  return static_cast<float>(0.5 * x * (1.0 + std::erf(x * 0.70710678118654752440)));
}
inline float gelu_derivative(float x) noexcept {
  const double cdf = 0.5 * (1.0 + std::erf(x * 0.70710678118654752440));
  const double pdf = 0.39894228040143267794 * std::exp(-0.5 * static_cast<double>(x) * x);
  return static_cast<float>(cdf + x * pdf);
}
}  // namespace detail

class gelu {
 public:
  using matrix_type = matrix;
  matrix forward(const matrix& x, bool training);
  matrix backward(const matrix& dy, bool need_dx);
  std::span<parameter> params() noexcept { return {}; }
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }

 private:
  std::vector<matrix> saved_;
};

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE matrix gelu::forward(const matrix& x, bool training) {
  matrix y = x;
  for (auto& v : y.data) v = detail::gelu(v);
  if (training) saved_.push_back(x);
  return y;
}

DDP_RUNTIME_INLINE matrix gelu::backward(const matrix& dy, bool need_dx) {
  const matrix x = pop_saved(saved_, "gelu");
  if (!need_dx) return {};
  matrix dx = dy;
  for (std::size_t i = 0; i < dx.size(); ++i) dx.data[i] *= detail::gelu_derivative(x.data[i]);
  return dx;
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::nn
