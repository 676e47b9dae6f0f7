#pragma once
// The matrix algebra a low-rank communication hook (comm_hook::powersgd) runs on the host
// device: products through CBLAS (ddp/host/blas.hpp, OpenBLAS: link ddp::nn), the rest as loops.
// Include it beside <ddp/policy/powersgd.hpp> when the trainer runs on the host device. The CUDA device's
// counterparts are in ddp/cuda/linalg.hpp; both are found by argument-dependent lookup.
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>

#include "ddp/core/error.hpp"
#include "ddp/core/vectorize.hpp"
#include "ddp/host/device.hpp"
#include "ddp/host/blas.hpp"

namespace ddp::host {

// C[m x n] = alpha * op(A) op(B) + beta * C, row-major.
inline void gemm(device&, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                 const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                 std::size_t ldc) {
  constexpr auto most = static_cast<std::size_t>(std::numeric_limits<int>::max());
  for (const std::size_t v : {m, n, k, lda, ldb, ldc})
    if (v > most)
      throw error("host", "gemm", -1,
                  "a matrix dimension of " + std::to_string(v) + " exceeds CBLAS's int sizes (2^31 - 1)");
  blas::use_one_thread_per_rank();
  blas::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// y += alpha * x
DDP_VECTORIZE inline void axpy(device&, std::size_t n, float alpha, const float* x, float* y) {
  for (std::size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Gram-Schmidt over the columns of a row-major rows x cols matrix: each column divided by its
// norm plus `eps` (so a zero column stays zero), then taken out of the columns after it. Sums in
// double, in row order: the same bits every run.
inline void orthonormalize_columns(device&, float* a, std::size_t rows, std::size_t cols, float eps) {
  for (std::size_t j = 0; j < cols; ++j) {
    double squares = 0.0;
    for (std::size_t i = 0; i < rows; ++i) squares += static_cast<double>(a[i * cols + j]) * a[i * cols + j];
    const float inverse = 1.0f / (static_cast<float>(std::sqrt(squares)) + eps);
    for (std::size_t i = 0; i < rows; ++i) a[i * cols + j] *= inverse;
    for (std::size_t k = j + 1; k < cols; ++k) {
      double dot = 0.0;
      for (std::size_t i = 0; i < rows; ++i) dot += static_cast<double>(a[i * cols + j]) * a[i * cols + k];
      const auto d = static_cast<float>(dot);
      for (std::size_t i = 0; i < rows; ++i) a[i * cols + k] -= d * a[i * cols + j];
    }
  }
}

}  // namespace ddp::host
