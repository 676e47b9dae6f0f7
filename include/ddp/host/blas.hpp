#pragma once
// CBLAS from OpenBLAS (Debian's libopenblas-dev), for the host path: the reference layers
// (ddp/nn, as ddp::nn::blas) and the host device's matrix algebra (ddp/host/linalg.hpp). Link
// ddp::nn. Ranks are threads or processes already, so OpenBLAS is held to one thread: its own
// pool would compete with the ranks for the cores.
#include <cblas.h>

#include <cctype>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

namespace ddp::host::blas {

inline void use_one_thread_per_rank() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// The OpenBLAS kernels that suit this CPU's vector units: "SkylakeX" (AVX-512), "Haswell"
// (AVX2 and FMA), or nothing on older or non-x86 CPUs.
inline std::optional<std::string> suited_core() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return std::nullopt;
}

// OpenBLAS before 0.3.25 falls back to its Prescott (SSE3) kernels on an x86 CPU newer than it
// knows (OpenBLAS issue #4267): Debian 12's 0.3.21 does so on a Xeon of family 6,
// model 207, where SGEMM then runs about 4x slower. OpenBLAS picks its kernels once, when it
// loads, so the fix is OPENBLAS_CORETYPE in the environment of the process. Returns what to
// tell the user when that fallback happened and the user did not ask for it; nothing otherwise.
inline std::optional<std::string> kernel_warning() {
  std::string core = openblas_get_corename();
  for (auto& ch : core) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (core != "prescott" || std::getenv("OPENBLAS_CORETYPE")) return std::nullopt;
  const auto better = suited_core();
  if (!better) return std::nullopt;
  return "OpenBLAS (" + std::string(openblas_get_config()) +
         ") chose its Prescott (SSE3) kernels although this CPU has " +
         (*better == "SkylakeX" ? "AVX-512" : "AVX2") +
         "; its GEMM runs several times slower than it can. Start the program with OPENBLAS_CORETYPE=" + *better +
         " in the environment (scripts/run-example.sh does; OpenBLAS issue #4267, fixed in 0.3.25)";
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

}  // namespace ddp::host::blas
