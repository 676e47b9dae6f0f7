#pragma once
// Row-major SGEMM through cuBLAS (column-major): C = A·B in row-major is C^T = B^T·A^T in
// column-major, so the operands swap and the shapes transpose; no data moves.
#include <cublas_v2.h>

#include <limits>
#include <string>

#include "ddp/cuda/device.hpp"

namespace ddp::cuda::blas {

// cuBLAS takes int sizes: a dimension past 2^31 - 1 is an error naming it, not a wrapped size.
inline int blas_int(std::size_t v, const char* name, call_site site) {
  if (v > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    throw error("cuda", "cublasSgemm", site.rank,
                std::string(name) + " = " + std::to_string(v) + " exceeds cuBLAS's int sizes (2^31 - 1) on device " +
                    std::to_string(site.device) + "; split the matrix into parts below it");
  return static_cast<int>(v);
}

// C[m x n] = alpha * op(A) op(B) + beta * C, row-major, on the device's stream. FP32 throughout
// (no TF32), so results match the host path up to summation order.
inline void gemm(cuda::device& dev, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k,
                 float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                 std::size_t ldc) {
  if (m == 0 || n == 0) return;
  const auto site = dev.site();
  const int im = blas_int(m, "m", site), in = blas_int(n, "n", site), ik = blas_int(k, "k", site);
  const int ilda = blas_int(lda, "lda", site), ildb = blas_int(ldb, "ldb", site), ildc = blas_int(ldc, "ldc", site);
  cublasHandle_t h = dev.blas();
  check(cublasSgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, in, im, ik, &alpha, b,
                    ildb, a, ilda, &beta, c, ildc),
        "cublasSgemm", site);
}

// For each i < batch: C_i = alpha * op(A_i) op(B_i) + beta * C_i, row-major, A_i at a + i * stride_a
// (B_i and C_i alike): one cuBLAS call for many equal products (an attention's sequences and heads).
inline void gemm_strided_batched(cuda::device& dev, bool trans_a, bool trans_b, std::size_t m, std::size_t n,
                                 std::size_t k, float alpha, const float* a, std::size_t lda, std::size_t stride_a,
                                 const float* b, std::size_t ldb, std::size_t stride_b, float beta, float* c,
                                 std::size_t ldc, std::size_t stride_c, std::size_t batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  const auto site = dev.site();
  const int im = blas_int(m, "m", site), in = blas_int(n, "n", site), ik = blas_int(k, "k", site);
  const int ilda = blas_int(lda, "lda", site), ildb = blas_int(ldb, "ldb", site), ildc = blas_int(ldc, "ldc", site);
  const int count = blas_int(batch, "batch", site);
  check(cublasSgemmStridedBatched(dev.blas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  in, im, ik, &alpha, b, ildb, static_cast<long long>(stride_b), a, ilda,
                                  static_cast<long long>(stride_a), &beta, c, ildc, static_cast<long long>(stride_c),
                                  count),
        "cublasSgemmStridedBatched", site);
}

}  // namespace ddp::cuda::blas
