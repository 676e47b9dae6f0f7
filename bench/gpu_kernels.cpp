// The CUDA device's bucket and optimizer kernels against a device-to-device cudaMemcpy, measured
// alternately in one run (median of --repeats each) and reported as effective bandwidth and its
// ratio to the copy's; then each kernel once more on known inputs, its result checked against
// the host:
//   gpu_kernels --sizes-mib 64,256 --repeats 20 [--target 85] [--out kernels.csv]
// Bytes counted per element: copy, pack, unpack, scale 8; cast f32->bf16 6; sgd 20 (param and
// momentum read and written, gradient read); adamw 28. "uneven" rows use a bucket of one large,
// one medium and 62 small tensors instead of eight equal ones.
// The target (docs/testing.md): pack, unpack, scale and the fused optimizers at >= --target % of
// the copy's bandwidth at >= 64 MiB (the cast has none). The exit status is 1, with a line on
// stderr naming the kernel, the size, the measured ratio and the target, when a kernel falls
// below it, and naming the kernel and the first wrong element when a result is wrong.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "options.hpp"
#include "ddp/cuda/device_vector.hpp"
#include "ddp/host/half.hpp"
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

// The inputs of the data checks: multiples of 1/1024 in (-1, 1) that change from one index to the
// next, so an element read from or written to the wrong place shows.
float pattern(std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 2654435761u) % 2001u) - 1000) / 1024.0f;
}

// Elements of `got` that differ from want(i) by more than tolerance(i) (0: bit for bit), and the
// first of them.
struct mismatch {
  std::size_t count = 0, first = 0;
  double got = 0, want = 0;
};
template <class T, class Want, class Tolerance>
mismatch compare(const std::vector<T>& got, Want want, Tolerance tolerance) {
  mismatch m;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const T w = want(i);
    const double t = tolerance(i);
    const bool same = t == 0 ? std::memcmp(&got[i], &w, sizeof(T)) == 0
                             : std::fabs(static_cast<double>(got[i]) - static_cast<double>(w)) <= t;
    if (!same && m.count++ == 0) m = {1, i, static_cast<double>(got[i]), static_cast<double>(w)};
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::size_t> sizes_mib{64, 256};
  int repeats = 20, ordinal = 0, target_percent = 85;
  std::size_t target_from_mib = 64;
  std::string out;
  bench::options app{"CUDA kernels vs cudaMemcpy device-to-device, side by side, each result checked"};
  app.add("--sizes-mib", sizes_mib, "f32 buffer sizes in MiB");
  app.add("--repeats", repeats, "timed runs of each kernel (median reported)", 3, 1000);
  app.add("--device", ordinal, "CUDA device ordinal", 0);
  app.add("--target", target_percent, "least bandwidth of pack, unpack, scale and the optimizers, in % of the "
                                      "copy's (0: none); below it the exit status is 1", 0, 1000);
  app.add("--target-from-mib", target_from_mib, "sizes from which the target holds");
  app.add("--out", out, "also write the rows to this CSV file");
  if (auto exit_code = app.parse(argc, argv)) return *exit_code;

  std::vector<std::string> failures;
  std::string csv = "mib,kernel,ms,gb_per_s,vs_memcpy_percent,target_percent,data\n";
  try {
    ddp::cuda::device dev(ordinal);
    cudaDeviceProp prop{};
    ddp::cuda::check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
    std::printf("# gpu_kernels --sizes-mib ... --repeats %d on %s; target: >= %d%% of memcpy at >= %zu MiB\n", repeats,
                prop.name, target_percent, target_from_mib);
    std::printf("%10s %-14s %10s %10s %12s %8s %6s\n", "MiB", "kernel", "ms", "GB/s", "vs memcpy", "target", "data");
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
      // In both layouts parameter element i lives at b[i] and its gradient at a[i].
      ddp::cuda::device_vector<std::uint16_t> half(dev, n);
      const ddp::optim::sgd sgd{.lr = 1e-3f, .momentum = 0.9f};
      const ddp::optim::adamw adamw{};

      // The data checks: each kernel once on `inputs` (the pattern in b, and in a where read),
      // its outputs downloaded and compared with the host's.
      std::vector<float> inputs(n);
      for (std::size_t i = 0; i < n; ++i) inputs[i] = pattern(i);
      auto download = [&](const float* from, std::size_t count) {
        std::vector<float> host(count);
        dev.copy_to_host(host.data(), from, count * sizeof(float));
        return host;
      };
      auto exact = [&](std::size_t) { return 0.0; };
      auto same_as_inputs = [&](const std::vector<float>& got) {
        return compare(got, [&](std::size_t i) { return inputs[i]; }, exact);
      };
      // An optimizer's step 1 from zero state, on parameters and gradients both the pattern: the
      // host applies the same rule; allowed a few roundings' difference (another evaluation
      // order, a contracted multiply-add), far below one learning-rate step.
      auto check_rule = [&](auto state_slots, const auto& rule, const std::vector<ddp::segment>& layout) {
        constexpr int slots = decltype(state_slots)::value;
        dev.copy(b.data(), a.data(), n * sizeof(float));  // a holds the pattern: parameters := it
        dev.fill_zero(m.data(), 2 * n * sizeof(float));
        dev.elementwise<slots>(layout, a.data(), m.data(), n, rule);
        const auto params = download(b.data(), n), state = download(m.data(), static_cast<std::size_t>(slots) * n);
        std::vector<float> want_p(n), want_s(static_cast<std::size_t>(slots) * n);
        for (std::size_t i = 0; i < n; ++i) {
          float p = inputs[i], s[3] = {0, 0, 0};
          rule(p, inputs[i], s);
          want_p[i] = p;
          for (int k = 0; k < slots; ++k) want_s[static_cast<std::size_t>(k) * n + i] = s[k];
        }
        auto tolerance = [&](std::size_t i) {
          const std::size_t e = i % n;
          return 1e-5 * std::max({std::fabs(static_cast<double>(inputs[e])), std::fabs(static_cast<double>(want_p[e])), 1e-3});
        };
        mismatch r = compare(params, [&](std::size_t i) { return want_p[i]; }, tolerance);
        const mismatch s = compare(state, [&](std::size_t i) { return want_s[i]; }, tolerance);
        if (r.count == 0 && s.count > 0) r = s;
        else r.count += s.count;
        return r;
      };
      struct kernel {
        std::string name;
        double bytes_per_element;
        bool has_target;
        std::function<void()> run;
        std::function<mismatch()> check;
      };
      const std::vector<kernel> kernels{
          {"pack", 8, true, [&] { dev.pack(segs, a.data()); },
           [&] {
             dev.copy_from_host(b.data(), inputs.data(), n * sizeof(float));
             dev.fill_zero(a.data(), n * sizeof(float));
             dev.pack(segs, a.data());
             return same_as_inputs(download(a.data(), n));
           }},
          {"unpack", 8, true, [&] { dev.unpack(segs, a.data()); },
           [&] {
             dev.copy_from_host(a.data(), inputs.data(), n * sizeof(float));
             dev.fill_zero(b.data(), n * sizeof(float));
             dev.unpack(segs, a.data());
             return same_as_inputs(download(b.data(), n));
           }},
          {"pack uneven", 8, true, [&] { dev.pack(uneven, a.data()); },
           [&] {
             dev.copy_from_host(b.data(), inputs.data(), n * sizeof(float));
             dev.fill_zero(a.data(), n * sizeof(float));
             dev.pack(uneven, a.data());
             return same_as_inputs(download(a.data(), n));
           }},
          {"scale", 8, true, [&] { dev.scale(a.data(), n, 0.999f); },
           [&] {
             dev.copy_from_host(a.data(), inputs.data(), n * sizeof(float));
             dev.scale(a.data(), n, 0.999f);
             return compare(download(a.data(), n), [&](std::size_t i) { return inputs[i] * 0.999f; }, exact);
           }},
          {"cast f32>bf16", 6, false,
           [&] { dev.cast({a.data(), n, ddp::dtype::f32}, {half.data(), n, ddp::dtype::bf16}); },
           [&] {
             dev.copy_from_host(a.data(), inputs.data(), n * sizeof(float));
             dev.cast({a.data(), n, ddp::dtype::f32}, {half.data(), n, ddp::dtype::bf16});
             std::vector<std::uint16_t> got(n);
             dev.copy_to_host(got.data(), half.data(), n * sizeof(std::uint16_t));
             return compare(got, [&](std::size_t i) { return ddp::host::to_bf16(inputs[i]); }, exact);
           }},
          {"sgd", 20, true, [&] { dev.elementwise<1>(segs, a.data(), m.data(), n, sgd.at(1)); },
           [&] {
             dev.copy_from_host(a.data(), inputs.data(), n * sizeof(float));
             return check_rule(std::integral_constant<int, 1>{}, sgd.at(1), segs);
           }},
          {"sgd uneven", 20, true, [&] { dev.elementwise<1>(uneven, a.data(), m.data(), n, sgd.at(1)); },
           [&] {
             dev.copy_from_host(a.data(), inputs.data(), n * sizeof(float));
             return check_rule(std::integral_constant<int, 1>{}, sgd.at(1), uneven);
           }},
          {"adamw", 28, true, [&] { dev.elementwise<2>(segs, a.data(), m.data(), n, adamw.at(1)); },
           [&] {
             dev.copy_from_host(a.data(), inputs.data(), n * sizeof(float));
             return check_rule(std::integral_constant<int, 2>{}, adamw.at(1), segs);
           }},
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
      std::printf("%10zu %-14s %10.3f %10.1f %11.1f%% %8s %6s\n", mib, "memcpy D2D", median(copy_ms), copy_gbs, 100.0, "",
                  "");
      csv += std::to_string(mib) + ",memcpy D2D," + std::to_string(median(copy_ms)) + "," + std::to_string(copy_gbs) +
             ",100,,\n";
      const bool target_holds = target_percent > 0 && mib >= target_from_mib;
      for (std::size_t k = 0; k < kernels.size(); ++k) {
        const double ms = median(kernel_ms[k]);
        const double gbs = kernels[k].bytes_per_element * static_cast<double>(n) / (ms * 1e6);
        const double percent = 100.0 * gbs / copy_gbs;
        const mismatch wrong = kernels[k].check();
        const bool has_target = target_holds && kernels[k].has_target, below = has_target && percent < target_percent;
        const std::string target = has_target ? (below ? "BELOW" : ">=" + std::to_string(target_percent) + "%") : "-";
        const std::string data = wrong.count ? "WRONG" : "ok";
        std::printf("%10zu %-14s %10.3f %10.1f %11.1f%% %8s %6s\n", mib, kernels[k].name.c_str(), ms, gbs, percent,
                    target.c_str(), data.c_str());
        csv += std::to_string(mib) + "," + kernels[k].name + "," + std::to_string(ms) + "," + std::to_string(gbs) + "," +
               std::to_string(percent) + "," + (has_target ? std::to_string(target_percent) : "") + "," + data + "\n";
        char line[400];
        if (below) {
          std::snprintf(line, sizeof line, "%s at %zu MiB reached %.1f%% of cudaMemcpy's bandwidth (%.1f of %.1f GB/s), "
                        "below the %d%% target", kernels[k].name.c_str(), mib, percent, gbs, copy_gbs, target_percent);
          failures.push_back(line);
        }
        if (wrong.count) {
          std::snprintf(line, sizeof line, "%s at %zu MiB: %zu of %zu elements wrong, the first at %zu: %.9g, not %.9g",
                        kernels[k].name.c_str(), mib, wrong.count, n, wrong.first, wrong.got, wrong.want);
          failures.push_back(line);
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_kernels: FAILED: %s\n", e.what());
    return 1;
  }
  if (!out.empty()) {
    std::FILE* f = std::fopen(out.c_str(), "w");
    if (!f || std::fputs(csv.c_str(), f) < 0 || std::fclose(f) != 0) {
      std::fprintf(stderr, "gpu_kernels: FAILED: cannot write %s\n", out.c_str());
      return 1;
    }
  }
  std::fflush(stdout);
  for (const auto& f : failures) std::fprintf(stderr, "gpu_kernels: FAILED: %s\n", f.c_str());
  if (failures.empty()) std::printf("gpu_kernels: every kernel at its target, every result right\n");
  return failures.empty() ? 0 : 1;
}
