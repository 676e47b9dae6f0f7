// all_reduce through ddp::mpi::communicator against raw MPI_Allreduce on the same buffers,
// alternated size by size in one run (float sum, in place). Run under mpirun:
//   mpirun -np 2 build/bench/mpi_all_reduce [--min-bytes 4096] [--max-bytes 268435456]

#include <span>

#include "collective_sweep.hpp"
#include "options.hpp"
#include "ddp/comm/collectives.hpp"
#include "ddp/mpi/communicator.hpp"

int main(int argc, char** argv) {
  ddp::mpi::environment env(&argc, &argv);
  bench::options app{"all_reduce: ddp's MPI communicator against raw MPI_Allreduce"};
  bench::sweep_options o;
  bench::add_sweep_options(app, o);
  if (auto exit_code = app.parse(argc, argv)) return *exit_code;

  ddp::mpi::communicator comm;
  const int n = comm.size();
  const double bus = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  if (comm.rank() == 0) {
    std::printf("# ddp::mpi all_reduce vs MPI_Allreduce, float sum in place, %d ranks\n# command: mpirun -np %d %s\n",
                n, n, bench::command_line(argc, argv).c_str());
    std::printf("%12s %12s %12s %14s %14s %8s\n", "size(B)", "raw(us)", "ddp(us)", "raw busbw", "ddp busbw", "ddp/raw");
  }
  for (std::size_t bytes : bench::sizes(o)) {
    const int iterations = bench::iterations_for(bytes, o.iterations);
    std::vector<float> v(bytes / sizeof(float), 1.0f);
    auto time = [&](auto&& op) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = bench::clock_type::now();
      for (int i = 0; i < iterations; ++i) op();
      double s = std::chrono::duration<double>(bench::clock_type::now() - t0).count() / iterations;
      MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      return s;
    };
    auto raw = [&] { MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
    auto wrapped = [&] { ddp::all_reduce(comm, std::span<float>(v), ddp::reduce_op::sum); };
    raw(), wrapped();  // warm-up
    double best_raw = 1e30, best_ddp = 1e30;
    for (int rep = 0; rep < 3; ++rep) {  // alternate, so drifts of the machine hit both
      best_raw = std::min(best_raw, time(raw));
      best_ddp = std::min(best_ddp, time(wrapped));
    }
    if (comm.rank() == 0) {
      const double raw_bus = static_cast<double>(bytes) / best_raw / 1e9 * bus;
      const double ddp_bus = static_cast<double>(bytes) / best_ddp / 1e9 * bus;
      std::printf("%12zu %12.1f %12.1f %10.2f GB/s %10.2f GB/s %7.0f%%\n", bytes, best_raw * 1e6, best_ddp * 1e6, raw_bus,
                  ddp_bus, 100 * ddp_bus / raw_bus);
      std::fflush(stdout);
    }
  }
}
