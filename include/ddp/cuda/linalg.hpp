#pragma once
// The matrix algebra a low-rank communication hook (comm_hook::powersgd) runs on the CUDA
// device, queued on its stream: products and axpy through cuBLAS, orthonormalisation in ddp's
// kernel. The host device's counterparts are in ddp/host/linalg.hpp.
#include <algorithm>
#include <climits>

#include "ddp/cuda/blas.hpp"
#include "ddp/cuda/kernels.hpp"

namespace ddp::cuda {

// C[m x n] = alpha * op(A) op(B) + beta * C, row-major.
inline void gemm(device& dev, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                 const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                 std::size_t ldc) {
  blas::gemm(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// y += alpha * x, in parts below cuBLAS's int sizes.
inline void axpy(device& dev, std::size_t n, float alpha, const float* x, float* y) {
  for (std::size_t done = 0; done < n;) {
    const int part = static_cast<int>(std::min<std::size_t>(n - done, INT_MAX));
    check(cublasSaxpy(dev.blas(), part, &alpha, x + done, 1, y + done, 1), "cublasSaxpy", dev.site());
    done += static_cast<std::size_t>(part);
  }
}

inline void orthonormalize_columns(device& dev, float* a, std::size_t rows, std::size_t cols, float eps) {
  check(kernels::orthonormalize_columns(a, rows, cols, eps, dev.stream()), "orthonormalize_columns kernel", dev.site());
}

}  // namespace ddp::cuda
