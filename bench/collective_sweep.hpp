#pragma once
// An nccl-tests-style sweep: for each size, time a collective across all ranks and print
// time, algbw and busbw (busbw = algbw * 2(n-1)/n for all_reduce), beside the single-thread
// memcpy bandwidth of the same size measured in the same run (the ceiling on this machine).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "options.hpp"

namespace bench {

using clock_type = std::chrono::steady_clock;

struct sweep_options {
  std::size_t min_bytes = 4 << 10;
  std::size_t max_bytes = std::size_t{256} << 20;
  int iterations = 20;
  int warmup = 3;
  std::string csv;
};

inline void add_sweep_options(options& app, sweep_options& o) {
  app.add("--min-bytes", o.min_bytes, "smallest message", 4);
  app.add("--max-bytes", o.max_bytes, "largest message", 4);
  app.add("--iterations", o.iterations, "timed iterations per size (scaled up for small sizes)", 1);
}

// Seconds per iteration of f, best of `repeats` batches (the least disturbed on a shared host).
template <class F>
double seconds_per_call(F&& f, int iterations, int repeats = 3) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = clock_type::now();
    for (int i = 0; i < iterations; ++i) f();
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - t0).count() / iterations);
  }
  return best;
}

inline double memcpy_gbps(std::size_t bytes, int iterations) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  const double s = seconds_per_call([&] { std::memcpy(b.data(), a.data(), bytes); }, iterations);
  volatile char sink = b[bytes / 2];
  (void)sink;
  return static_cast<double>(bytes) / s / 1e9;
}

inline std::vector<std::size_t> sizes(const sweep_options& o) {
  std::vector<std::size_t> s;
  for (std::size_t b = o.min_bytes; b <= o.max_bytes; b *= 4) s.push_back(b);
  return s;
}

// Iterations that keep one size's batch near 0.2 s on this kind of machine.
inline int iterations_for(std::size_t bytes, int requested) {
  const std::size_t budget = std::size_t{2} << 30;  // bytes moved per batch
  return std::max(2, std::min<int>(requested * 50, static_cast<int>(budget / std::max<std::size_t>(bytes, 1))));
}

struct row {
  std::size_t bytes;
  double seconds, algbw, busbw, memcpy_bw;
};

inline void print_header(const char* title, const std::string& command) {
  std::printf("# %s\n# command: %s\n", title, command.c_str());
  std::printf("%12s %12s %10s %10s %12s %14s\n", "size(B)", "time(us)", "algbw(GB/s)",
              "busbw(GB/s)", "memcpy(GB/s)", "busbw/memcpy");
}

inline void print_row(const row& r) {
  std::printf("%12zu %12.1f %10.2f %10.2f %12.2f %13.0f%%\n", r.bytes, r.seconds * 1e6, r.algbw,
              r.busbw, r.memcpy_bw, 100.0 * r.busbw / r.memcpy_bw);
  std::fflush(stdout);
}

inline void write_csv(const std::string& path, const std::vector<row>& rows) {
  if (path.empty()) return;
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return;
  }
  std::fprintf(f, "bytes,seconds,algbw_gbps,busbw_gbps,memcpy_gbps\n");
  for (const auto& r : rows)
    std::fprintf(f, "%zu,%.9f,%.4f,%.4f,%.4f\n", r.bytes, r.seconds, r.algbw, r.busbw, r.memcpy_bw);
  std::fclose(f);
}

inline std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) s += (i ? " " : "") + std::string(argv[i]);
  return s;
}

}  // namespace bench
