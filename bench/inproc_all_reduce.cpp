// all_reduce sweep of the in-process communicator (float sum, in place).
//   inproc_all_reduce --ranks 2 [--min-bytes 4096] [--max-bytes 268435456] [--csv out.csv]
#include <span>

#include "collective_sweep.hpp"
#include "options.hpp"
#include "ddp/comm/collectives.hpp"
#include "ddp/inproc/launch.hpp"

int main(int argc, char** argv) {
  bench::options app{"all_reduce sweep of ddp's in-process communicator"};
  bench::sweep_options o;
  int ranks = 2;
  app.add("--ranks", ranks, "in-process ranks", 1, 64);
  bench::add_sweep_options(app, o);
  app.add("--csv", o.csv, "also write the table as CSV");
  if (auto exit_code = app.parse(argc, argv)) return *exit_code;

  bench::print_header(("ddp::inproc all_reduce, float sum in place, " + std::to_string(ranks) +
                       " ranks").c_str(),
                      bench::command_line(argc, argv));
  std::vector<bench::row> rows;
  for (std::size_t bytes : bench::sizes(o)) {
    const int iterations = bench::iterations_for(bytes, o.iterations);
    const std::size_t n = bytes / sizeof(float);
    auto seconds = ddp::inproc::launch(ranks, [&](ddp::inproc::communicator& comm) {
      std::vector<float> v(n, 1.0f);
      for (int i = 0; i < o.warmup; ++i) ddp::all_reduce(comm, std::span<float>(v), ddp::reduce_op::sum);
      double best = 1e30;
      for (int rep = 0; rep < 3; ++rep) {
        ddp::barrier(comm);
        const auto t0 = bench::clock_type::now();
        for (int i = 0; i < iterations; ++i)
          ddp::all_reduce(comm, std::span<float>(v), ddp::reduce_op::sum);
        best = std::min(best, std::chrono::duration<double>(bench::clock_type::now() - t0).count() / iterations);
      }
      return best;
    });
    const double s = *std::max_element(seconds.begin(), seconds.end());
    const double algbw = static_cast<double>(bytes) / s / 1e9;
    const double busbw = algbw * (ranks > 1 ? 2.0 * (ranks - 1) / ranks : 1.0);
    rows.push_back({bytes, s, algbw, busbw, bench::memcpy_gbps(bytes, iterations)});
    bench::print_row(rows.back());
  }
  bench::write_csv(o.csv, rows);
}
