// The machine's own ceiling for the scaling figure: single-precision GEMM of the example's
// first-layer shape on 1 thread against 2 threads (one OpenBLAS thread each), alternated.
//   gemm_scaling [--repeats 3]
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  CLI::App app{"GEMM throughput on 1 and 2 threads: the hardware ceiling of data-parallel scaling"};
  int repeats = 3;
  app.add_option("--repeats", repeats, "alternated measurements of each")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  openblas_set_num_threads(1);
  const int m = 64, n = 512, k = 784, calls = 300;
  auto work = [&] {
    std::vector<float> a(m * k, 1.0f), b(n * k, 1.0f), c(m * n);
    for (int i = 0; i < calls; ++i)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
  };
  double best[3] = {0, 0, 0};
  for (int r = 0; r < repeats; ++r)
    for (int threads : {1, 2}) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) pool.emplace_back(work);
      for (auto& t : pool) t.join();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best[threads] = std::max(best[threads], threads * calls * 2.0 * m * n * k / s / 1e9);
    }
  std::printf("gemm %dx%dx%d (OpenBLAS %s kernels): 1 thread %.1f GFLOP/s, 2 threads %.1f GFLOP/s, speed-up %.2fx (hardware ceiling)\n", m, n,
              k, openblas_get_corename(), best[1], best[2], best[2] / best[1]);
}
