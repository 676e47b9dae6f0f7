// all_reduce through ddp::nccl::communicator against raw ncclAllReduce on the same device
// buffers, alternated size by size in one run (float sum, in place), one in-process rank per GPU:
//   nccl_all_reduce [--gpus N] [--min-bytes 4096] [--max-bytes 268435456]
// Both sides are timed as the trainer uses them: launch, then wait for the result (ddp: wait()
// and the compute stream; raw: cudaStreamSynchronize of NCCL's stream).


#include "collective_sweep.hpp"
#include "options.hpp"
#include "ddp/comm/collectives.hpp"
#include "ddp/cuda/device_vector.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/nccl/communicator.hpp"

int main(int argc, char** argv) {
  bench::options app{"all_reduce: ddp's NCCL communicator against raw ncclAllReduce"};
  bench::sweep_options o;
  int gpus = 0;
  app.add("--gpus", gpus, "ranks, one GPU each (0: every visible GPU)", 0);
  bench::add_sweep_options(app, o);
  if (auto exit_code = app.parse(argc, argv)) return *exit_code;
  try {
    if (gpus <= 0) gpus = ddp::cuda::device_count();
    const double bus = gpus > 1 ? 2.0 * (gpus - 1) / gpus : 1.0;
    std::printf("# ddp::nccl all_reduce vs ncclAllReduce, float sum in place, %d rank(s), one GPU each\n# command: %s\n",
                gpus, bench::command_line(argc, argv).c_str());
    std::printf("%12s %12s %12s %14s %14s %8s\n", "size(B)", "raw(us)", "ddp(us)", "raw busbw", "ddp busbw", "ddp/raw");
    ddp::inproc::launch(gpus, [&](ddp::inproc::communicator& host) {
      ddp::cuda::device dev(host.rank(), host.rank());
      auto comm = ddp::nccl::bootstrap(host, dev);
      // A second, raw communicator over the same GPUs for the baseline.
      ncclUniqueId id{};
      if (host.rank() == 0) ddp::nccl::check(ncclGetUniqueId(&id), "ncclGetUniqueId", 0);
      host.broadcast(ddp::mutable_buffer{&id, sizeof id, ddp::dtype::u8}, 0).wait();
      ncclComm_t raw_comm = nullptr;
      ddp::nccl::check(ncclCommInitRank(&raw_comm, host.size(), id, host.rank()), "ncclCommInitRank", host.rank());
      ddp::cuda::stream raw_stream(dev.site());
      for (std::size_t bytes : bench::sizes(o)) {
        const int iterations = bench::iterations_for(bytes, o.iterations);
        auto v = ddp::cuda::device_vector<float>::zeros(dev, bytes / sizeof(float));
        const ddp::mutable_buffer buf{v.data(), v.size(), ddp::dtype::f32};
        dev.synchronize();
        auto time = [&](auto&& op) {
          host.barrier().wait();
          const auto t0 = bench::clock_type::now();
          for (int i = 0; i < iterations; ++i) op();
          double s = std::chrono::duration<double>(bench::clock_type::now() - t0).count() / iterations;
          ddp::all_reduce(host, std::span<double>(&s, 1), ddp::reduce_op::max);
          return s;
        };
        auto raw = [&] {
          ddp::nccl::check(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat32, ncclSum, raw_comm, raw_stream.get()),
                           "ncclAllReduce", host.rank(), raw_comm);
          raw_stream.synchronize();
        };
        auto wrapped = [&] {
          comm.all_reduce(buf, buf, ddp::reduce_op::sum).wait();
          dev.synchronize();
        };
        raw(), wrapped();  // warm-up
        double best_raw = 1e30, best_ddp = 1e30;
        for (int rep = 0; rep < 3; ++rep) {
          best_raw = std::min(best_raw, time(raw));
          best_ddp = std::min(best_ddp, time(wrapped));
        }
        if (host.rank() == 0) {
          const double raw_bus = static_cast<double>(bytes) / best_raw / 1e9 * bus;
          const double ddp_bus = static_cast<double>(bytes) / best_ddp / 1e9 * bus;
          std::printf("%12zu %12.1f %12.1f %10.2f GB/s %10.2f GB/s %7.0f%%\n", bytes, best_raw * 1e6, best_ddp * 1e6,
                      raw_bus, ddp_bus, 100 * ddp_bus / raw_bus);
          std::fflush(stdout);
        }
      }
      ncclCommDestroy(raw_comm);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
