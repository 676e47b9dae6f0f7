// Host kernels the trainer runs per bucket, against memcpy of the same bytes, and the cost of one
// step-timeline phase detached and attached:
//   host_kernels --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "ddp/host/device.hpp"
#include "ddp/trainer/timeline.hpp"
#include "ddp/optim/optimizer.hpp"

namespace {

void set_bytes(benchmark::State& s, std::size_t bytes_per_iteration) {
  s.SetBytesProcessed(static_cast<std::int64_t>(s.iterations() * bytes_per_iteration));
}

void bm_memcpy(benchmark::State& s) {
  const auto n = static_cast<std::size_t>(s.range(0));
  std::vector<float> a(n, 1.0f), b(n);
  for (auto _ : s) {
    std::memcpy(b.data(), a.data(), n * 4);
    benchmark::DoNotOptimize(b.data());
  }
  set_bytes(s, 2 * n * 4);
}

void bm_scale(benchmark::State& s) {
  const auto n = static_cast<std::size_t>(s.range(0));
  std::vector<float> a(n, 1.0f);
  ddp::host::device dev;
  for (auto _ : s) {
    dev.scale(a.data(), n, 0.5f);
    benchmark::DoNotOptimize(a.data());
  }
  set_bytes(s, 2 * n * 4);
}

void bm_pack(benchmark::State& s) {
  const auto n = static_cast<std::size_t>(s.range(0));
  std::vector<float> a(n / 2, 1.0f), b(n - n / 2, 2.0f), bucket(n);
  std::vector<ddp::segment> segs{{a.data(), 0, a.size()}, {b.data(), a.size(), b.size()}};
  ddp::host::device dev;
  for (auto _ : s) {
    dev.pack(segs, bucket.data());
    benchmark::DoNotOptimize(bucket.data());
  }
  set_bytes(s, 2 * n * 4);
}

// A communication hook's casts: f32 scaled into 16 bits (its bytes: 4 read, 2 written per
// element) and back (2 read, 4 written), arg 1 = bf16, 0 = f16; and the portable loop beside the
// x86 forms (arg 2: 1 = portable).
void bm_narrow(benchmark::State& s) {
  const auto n = static_cast<std::size_t>(s.range(0));
  std::vector<float> a(n, 0.3f);
  std::vector<std::uint16_t> h(n);
  const bool bf16 = s.range(1) != 0, portable = s.range(2) != 0;
  for (auto _ : s) {
    if (bf16) portable ? ddp::host::narrow_loop<ddp::host::bf16_format>(a.data(), h.data(), n, 0.5f)
                       : ddp::host::narrow<ddp::host::bf16_format>(a.data(), h.data(), n, 0.5f);
    else portable ? ddp::host::narrow_loop<ddp::host::f16_format>(a.data(), h.data(), n, 0.5f)
                  : ddp::host::narrow<ddp::host::f16_format>(a.data(), h.data(), n, 0.5f);
    benchmark::DoNotOptimize(h.data());
  }
  set_bytes(s, 6 * n);
}

void bm_widen(benchmark::State& s) {
  const auto n = static_cast<std::size_t>(s.range(0));
  std::vector<std::uint16_t> h(n, 0x3c00);
  std::vector<float> a(n);
  const bool bf16 = s.range(1) != 0, portable = s.range(2) != 0;
  for (auto _ : s) {
    if (bf16) portable ? ddp::host::widen_loop<ddp::host::bf16_format>(h.data(), a.data(), n)
                       : ddp::host::widen<ddp::host::bf16_format>(h.data(), a.data(), n);
    else portable ? ddp::host::widen_loop<ddp::host::f16_format>(h.data(), a.data(), n)
                  : ddp::host::widen<ddp::host::f16_format>(h.data(), a.data(), n);
    benchmark::DoNotOptimize(a.data());
  }
  set_bytes(s, 6 * n);
}

void bm_sgd(benchmark::State& s) {
  const auto n = static_cast<std::size_t>(s.range(0));
  std::vector<float> p(n, 1.0f), g(n, 0.1f), m(n, 0.0f);
  ddp::segment seg{p.data(), 0, n};
  ddp::host::device dev;
  const ddp::optim::sgd o{.lr = 0.01f, .momentum = 0.9f, .weight_decay = 1e-4f};
  for (auto _ : s) {
    dev.elementwise<1>({&seg, 1}, g.data(), m.data(), n, o.at(1));
    benchmark::DoNotOptimize(p.data());
  }
  set_bytes(s, 5 * n * 4);  // read p, g, m; write p, m
}

void bm_adamw(benchmark::State& s) {
  const auto n = static_cast<std::size_t>(s.range(0));
  std::vector<float> p(n, 1.0f), g(n, 0.1f), state(2 * n, 0.0f);  // m, then v
  ddp::segment seg{p.data(), 0, n};
  ddp::host::device dev;
  const ddp::optim::adamw o{};
  std::int64_t t = 0;
  for (auto _ : s) {
    dev.elementwise<2>({&seg, 1}, g.data(), state.data(), n, o.at(++t));
    benchmark::DoNotOptimize(p.data());
  }
  set_bytes(s, 7 * n * 4);  // read p, g, m, v; write p, m, v
}

// One phase of the step timeline, detached (what every step pays when no timeline records: a
// branch on a null pointer) and attached (two clock reads and an event).
void bm_timeline_span(benchmark::State& s) {
  ddp::timeline t(std::size_t{1} << 16);
  ddp::timeline* attached = s.range(0) ? &t : nullptr;
  benchmark::DoNotOptimize(attached);
  for (auto _ : s) {
    ddp::detail::timeline_span span(attached, "forward", 0);
    benchmark::ClobberMemory();
    if (t.events().size() == (std::size_t{1} << 16)) t.clear();
  }
}

}  // namespace

BENCHMARK(bm_timeline_span)->Arg(0)->Arg(1)->ArgName("attached");
BENCHMARK(bm_memcpy)->RangeMultiplier(16)->Range(1 << 16, 1 << 24);
BENCHMARK(bm_scale)->RangeMultiplier(16)->Range(1 << 16, 1 << 24);
BENCHMARK(bm_pack)->RangeMultiplier(16)->Range(1 << 16, 1 << 24);
BENCHMARK(bm_narrow)->ArgsProduct({{1 << 20}, {1, 0}, {0, 1}})->ArgNames({"n", "bf16", "portable"});
BENCHMARK(bm_widen)->ArgsProduct({{1 << 20}, {1, 0}, {0, 1}})->ArgNames({"n", "bf16", "portable"});
BENCHMARK(bm_sgd)->RangeMultiplier(16)->Range(1 << 16, 1 << 24);
BENCHMARK(bm_adamw)->RangeMultiplier(16)->Range(1 << 16, 1 << 24);
BENCHMARK_MAIN();
