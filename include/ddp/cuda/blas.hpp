#pragma once
// Row-major SGEMM through cuBLAS (column-major): C = A·B in row-major is C^T = B^T·A^T in
// column-major, so the operands swap and the shapes transpose; no data moves.
#include <cublas_v2.h>

#include "ddp/cuda/device.hpp"

namespace ddp::cuda::blas {

// C[m x n] = alpha * op(A) op(B) + beta * C, row-major, on the device's stream. FP32 throughout
// (no TF32), so results match the host path up to summation order.
inline void gemm(cuda::device& dev, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k,
                 float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                 std::size_t ldc) {
  if (m == 0 || n == 0) return;
  cublasHandle_t h = dev.blas();
  check(cublasSgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                    static_cast<int>(m), static_cast<int>(k), &alpha, b, static_cast<int>(ldb), a, static_cast<int>(lda),
                    &beta, c, static_cast<int>(ldc)),
        "cublasSgemm", dev.site());
}

}  // namespace ddp::cuda::blas
