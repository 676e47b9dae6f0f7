// The CUDA device's bucket and optimizer kernels against a device-to-device cudaMemcpy, measured
// alternately in one run (median of --repeats each) and reported as effective bandwidth and its
// ratio to the copy's:
//   gpu_kernels --sizes-mib 64,256 --repeats 20
// Bytes counted per element: copy, pack, unpack, scale 8; cast f32->bf16 6; sgd 20 (param and
// momentum read and written, gradient read); adamw 28. "uneven" rows use a bucket of one large,
// one medium and 62 small tensors instead of eight equal ones.

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "options.hpp"
#include "ddp/cuda/device_vector.hpp"
#include "ddp/optim/optimizer.hpp"

namespace {

using dvec = ddp::cuda::device_vector<float>;

double time_ms(ddp::cuda::device& dev, const std::function<void()>& f) {
  ddp::cuda::event start(dev.site(), true), stop(dev.site(), true);
  start.record(dev.stream());
  f();
  stop.record(dev.stream());
  stop.synchronize();
  float ms = 0;
  ddp::cuda::check(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime", dev.site());
  return ms;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::size_t> sizes_mib{64, 256};
  int repeats = 20, ordinal = 0;
  bench::options app{"CUDA kernels vs cudaMemcpy device-to-device, side by side"};
  app.add("--sizes-mib", sizes_mib, "f32 buffer sizes in MiB");
  app.add("--repeats", repeats, "timed runs of each kernel (median reported)", 3, 1000);
  app.add("--device", ordinal, "CUDA device ordinal", 0);
  if (auto exit_code = app.parse(argc, argv)) return *exit_code;

  try {
    ddp::cuda::device dev(ordinal);
    cudaDeviceProp prop{};
    ddp::cuda::check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
    std::printf("# gpu_kernels --sizes-mib ... --repeats %d on %s\n", repeats, prop.name);
    std::printf("%10s %-14s %10s %10s %12s\n", "MiB", "kernel", "ms", "GB/s", "vs memcpy");
    for (std::size_t mib : sizes_mib) {
      const std::size_t n = (mib << 20) / sizeof(float);
      auto a = dvec::zeros(dev, n), b = dvec::zeros(dev, n), m = dvec::zeros(dev, 2 * n);  // AdamW: m, then v
      // Eight parameters of a bucket, each 16-byte aligned inside it, as the trainer lays them out.
      std::vector<ddp::segment> segs;
      const std::size_t piece = n / 8 / 4 * 4;
      for (std::size_t k = 0; k < 8; ++k) segs.push_back({b.data() + k * piece, k * piece, k == 7 ? n - 7 * piece : piece});
      // A layer stack's bucket: half of it one weight, a quarter another, the rest in 62 small
      // tensors (biases, norms). Threads share the work by floats, not by tensors.
      std::vector<ddp::segment> uneven;
      const std::size_t half_n = n / 2 / 4 * 4, quarter = n / 4 / 4 * 4, small = (n - half_n - quarter) / 62 / 4 * 4;
      uneven.push_back({b.data(), 0, half_n});
      uneven.push_back({b.data() + half_n, half_n, quarter});
      for (std::size_t k = 0, at = half_n + quarter; k < 62; ++k, at += small)
        uneven.push_back({b.data() + at, at, k == 61 ? n - at : small});
      ddp::cuda::device_vector<std::uint16_t> half(dev, n);
      struct kernel {
        std::string name;
        double bytes_per_element;
        std::function<void()> run;
      };
      const ddp::optim::sgd sgd{.lr = 1e-3f, .momentum = 0.9f};
      const ddp::optim::adamw adamw{};
      const std::vector<kernel> kernels{
          {"pack", 8, [&] { dev.pack(segs, a.data()); }},
          {"unpack", 8, [&] { dev.unpack(segs, a.data()); }},
          {"pack uneven", 8, [&] { dev.pack(uneven, a.data()); }},
          {"scale", 8, [&] { dev.scale(a.data(), n, 0.999f); }},
          {"cast f32>bf16", 6,
           [&] { dev.cast({a.data(), n, ddp::dtype::f32}, {half.data(), n, ddp::dtype::bf16}); }},
          {"sgd", 20, [&] { dev.elementwise<1>(segs, a.data(), m.data(), n, sgd.at(1)); }},
          {"sgd uneven", 20, [&] { dev.elementwise<1>(uneven, a.data(), m.data(), n, sgd.at(1)); }},
          {"adamw", 28, [&] { dev.elementwise<2>(segs, a.data(), m.data(), n, adamw.at(1)); }},
      };
      auto copy = [&] { dev.copy(a.data(), b.data(), n * sizeof(float)); };
      for (int w = 0; w < 3; ++w) {  // warm-up
        copy();
        for (const auto& k : kernels) k.run();
      }
      dev.synchronize();
      std::vector<double> copy_ms;
      std::vector<std::vector<double>> kernel_ms(kernels.size());
      for (int r = 0; r < repeats; ++r)
        for (std::size_t k = 0; k < kernels.size(); ++k) {
          copy_ms.push_back(time_ms(dev, copy));
          kernel_ms[k].push_back(time_ms(dev, kernels[k].run));
        }
      const double copy_gbs = 8.0 * static_cast<double>(n) / (median(copy_ms) * 1e6);
      std::printf("%10zu %-14s %10.3f %10.1f %11.1f%%\n", mib, "memcpy D2D", median(copy_ms), copy_gbs, 100.0);
      for (std::size_t k = 0; k < kernels.size(); ++k) {
        const double ms = median(kernel_ms[k]);
        const double gbs = kernels[k].bytes_per_element * static_cast<double>(n) / (ms * 1e6);
        std::printf("%10zu %-14s %10.3f %10.1f %11.1f%%\n", mib, kernels[k].name.c_str(), ms, gbs, 100.0 * gbs / copy_gbs);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
