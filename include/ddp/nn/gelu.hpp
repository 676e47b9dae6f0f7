#pragma once
// GELU, exact: y = x * Phi(x) = x/2 * (1 + erf(x / sqrt 2)), PyTorch's nn.GELU() (its default,
// approximate='none'; not the tanh approximation). dy/dx = Phi(x) + x * phi(x), phi the normal
// density. Computed in f32 by vectorised loops (ddp/host/vector_math.hpp's normal_cdf_f32 and
// normal_pdf_f32). A training forward keeps the derivative at its input, as many floats as the
// input, for the backward to multiply by.
#include <span>
#include <utility>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/core/vectorize.hpp"
#include "ddp/host/vector_math.hpp"
#include "ddp/nn/layer.hpp"
#include "ddp/nn/saved_stack.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::nn {

class gelu {
 public:
  using matrix_type = matrix;
  matrix forward(const matrix& x, bool training);
  matrix backward(const matrix& dy, bool need_dx);
  // The same, in x's (dy's) own storage: no new matrix.
  matrix forward(matrix&& x, bool training);
  matrix backward(matrix&& dy, bool need_dx);
  std::span<parameter> params() noexcept { return {}; }
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }

 private:
  saved_stack<matrix> saved_;  // per training forward: the derivative at its input

  // out = dy * the saved derivative (out may be dy's own storage), popping it.
  void multiply_by_derivative(const matrix& dy, float* out);
};

namespace detail {
#if DDP_RUNTIME_DEFINITIONS
// y = x Φ(x) over n elements.
DDP_VECTORIZE DDP_WIDE_VECTORS DDP_EXACT_FLOATS DDP_RUNTIME_INLINE void gelu_forward(const float* DDP_RESTRICT x,
                                                                                     float* DDP_RESTRICT y,
                                                                                     std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) y[i] = x[i] * host::normal_cdf_f32(x[i]);
}

// The same in place: x = x Φ(x).
DDP_VECTORIZE DDP_WIDE_VECTORS DDP_EXACT_FLOATS DDP_RUNTIME_INLINE void gelu_forward_in_place(float* DDP_RESTRICT x,
                                                                                              std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) x[i] = x[i] * host::normal_cdf_f32(x[i]);
}

// y = x Φ(x) (the same bits as gelu_forward) and the derivative d = Φ(x) + x φ(x), which the
// backward multiplies dy by.
DDP_VECTORIZE DDP_WIDE_VECTORS DDP_EXACT_FLOATS DDP_RUNTIME_INLINE void gelu_forward_derivative(
    const float* DDP_RESTRICT x, float* DDP_RESTRICT y, float* DDP_RESTRICT d, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const float cdf = host::normal_cdf_f32(x[i]);
    y[i] = x[i] * cdf;
    d[i] = cdf + x[i] * host::normal_pdf_f32(x[i]);
  }
}

// The same in place: x = x Φ(x), d = Φ(x) + x φ(x).
DDP_VECTORIZE DDP_WIDE_VECTORS DDP_EXACT_FLOATS DDP_RUNTIME_INLINE void gelu_forward_derivative_in_place(
    float* DDP_RESTRICT x, float* DDP_RESTRICT d, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float cdf = host::normal_cdf_f32(v);
    x[i] = v * cdf;
    d[i] = cdf + v * host::normal_pdf_f32(v);
  }
}
#else  // compiled in libddp_runtime (ddp/core/compiled_runtime.hpp)
void gelu_forward(const float* x, float* y, std::size_t n) noexcept;
void gelu_forward_in_place(float* x, std::size_t n) noexcept;
void gelu_forward_derivative(const float* x, float* y, float* d, std::size_t n) noexcept;
void gelu_forward_derivative_in_place(float* x, float* d, std::size_t n) noexcept;
#endif
}  // namespace detail

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE matrix gelu::forward(const matrix& x, bool training) {
  matrix y(x.rows, x.cols);
  if (training) {
    matrix& d = saved_.push();
    reshape(d, x.rows, x.cols);
    detail::gelu_forward_derivative(x.data.data(), y.data.data(), d.data.data(), x.size());
  } else {
    detail::gelu_forward(x.data.data(), y.data.data(), x.size());
  }
  return y;
}

DDP_RUNTIME_INLINE matrix gelu::forward(matrix&& x, bool training) {
  if (training) {
    matrix& d = saved_.push();
    reshape(d, x.rows, x.cols);
    detail::gelu_forward_derivative_in_place(x.data.data(), d.data.data(), x.size());
  } else {
    detail::gelu_forward_in_place(x.data.data(), x.size());
  }
  return std::move(x);
}

DDP_RUNTIME_INLINE void gelu::multiply_by_derivative(const matrix& dy, float* DDP_RESTRICT out) {
  const auto d = saved_.pop("gelu");
  if (dy.rows != d->rows || dy.cols != d->cols)
    throw std::invalid_argument("ddp::nn: gelu backward expects a gradient of " + std::to_string(d->rows) + " x " +
                                std::to_string(d->cols) + " (its forward's shape), got " + std::to_string(dy.rows) +
                                " x " + std::to_string(dy.cols));
  const float* DDP_RESTRICT dd = d->data.data();
  if (out == dy.data.data()) {
    for (std::size_t i = 0; i < dy.size(); ++i) out[i] *= dd[i];
  } else {
    const float* DDP_RESTRICT g = dy.data.data();
    for (std::size_t i = 0; i < dy.size(); ++i) out[i] = g[i] * dd[i];
  }
}

DDP_RUNTIME_INLINE matrix gelu::backward(const matrix& dy, bool need_dx) {
  if (!need_dx) {
    saved_.pop("gelu");
    return {};
  }
  matrix dx(dy.rows, dy.cols);
  multiply_by_derivative(dy, dx.data.data());
  return dx;
}

DDP_RUNTIME_INLINE matrix gelu::backward(matrix&& dy, bool need_dx) {
  if (!need_dx) {
    saved_.pop("gelu");
    return {};
  }
  multiply_by_derivative(dy, dy.data.data());
  return std::move(dy);
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::nn
