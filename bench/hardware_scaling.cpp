// The machine's own ceilings for the scaling figure, 1 thread against 2 (alternated, best of
// --repeats each): the example's two kinds of work on their own.
//   - compute-bound: SGEMM of the example's first-layer shape (one OpenBLAS thread each);
//   - memory-bound: ddp's fused SGD update over the example's 671,754 parameters (parameter,
//     gradient and momentum: 20 bytes per parameter), as every rank runs it each step.
// A data-parallel step mixes the two, so its speed-up from 1 to 2 ranks lies at best between them.
//   hardware_scaling [--repeats 3]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include "options.hpp"
#include "ddp/host/kernels.hpp"
#include "ddp/optim/optimizer.hpp"

namespace {

// Runs `work` once on each of `threads` threads; keeps the best rate (units of work per second).
void measure(int threads, const std::function<void()>& work, double units_per_run, double& best) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  best = std::max(best, threads * units_per_run / s);
}

}  // namespace

int main(int argc, char** argv) {
  bench::options app{"GEMM and the SGD update on 1 and 2 threads: the hardware ceilings of data-parallel scaling"};
  int repeats = 3;
  app.add("--repeats", repeats, "alternated measurements of each", 1);
  if (auto exit_code = app.parse(argc, argv)) return *exit_code;
  openblas_set_num_threads(1);

  const int m = 64, n = 512, k = 784, calls = 300;
  auto gemm = [&] {
    std::vector<float> a(m * k, 1.0f), b(n * k, 1.0f), c(m * n);
    for (int i = 0; i < calls; ++i)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
  };
  const std::size_t params = 671'754;
  const int updates = 300;
  auto sgd = [&] {
    std::vector<float> p(params, 0.5f), g(params, 1e-3f), mom(params, 0.0f);
    const ddp::segment all{p.data(), 0, params};
    const ddp::optim::sgd o{.lr = 0.01f, .momentum = 0.9f};
    for (int i = 0; i < updates; ++i) ddp::host::elementwise<1>(std::span(&all, 1), g.data(), mom.data(), params, o.at(1));
  };

  double gemm_best[3] = {0, 0, 0}, sgd_best[3] = {0, 0, 0};
  for (int r = 0; r < repeats; ++r)
    for (int threads : {1, 2}) {
      measure(threads, gemm, calls * 2.0 * m * n * k / 1e9, gemm_best[threads]);
      measure(threads, sgd, updates * 20.0 * static_cast<double>(params) / 1e9, sgd_best[threads]);
    }
  std::printf("gemm %dx%dx%d (OpenBLAS %s kernels): 1 thread %.1f GFLOP/s, 2 threads %.1f GFLOP/s, speed-up %.2fx "
              "(compute ceiling)\n",
              m, n, k, openblas_get_corename(), gemm_best[1], gemm_best[2], gemm_best[2] / gemm_best[1]);
  std::printf("sgd update of %zu parameters: 1 thread %.1f GB/s, 2 threads %.1f GB/s, speed-up %.2fx (memory "
              "ceiling)\n",
              params, sgd_best[1], sgd_best[2], sgd_best[2] / sgd_best[1]);
}
