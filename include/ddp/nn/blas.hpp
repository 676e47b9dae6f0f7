#pragma once
// CBLAS from OpenBLAS (Debian's libopenblas-dev). Ranks are threads or processes already, so
// OpenBLAS is held to one thread: its own pool would compete with the ranks for the cores.
#include <cblas.h>

#include <mutex>

namespace ddp::nn::blas {

inline void use_one_thread_per_rank() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// C = alpha * op(A) op(B) + beta * C, row-major.
inline void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                 const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                 std::size_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

}  // namespace ddp::nn::blas
