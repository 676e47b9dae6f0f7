// all_reduce through ddp::nccl::communicator against raw ncclAllReduce on the same device
// buffers, alternated size by size in one run (float sum, in place), one in-process rank per GPU:
//   nccl_all_reduce [--gpus N] [--min-bytes 4096] [--max-bytes 268435456]
// One GPU: out of place (a copy; in place NCCL does nothing), and the in-place per-call overhead.
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
    // One rank: NCCL does nothing for an in-place all-reduce, so bandwidth means something only
    // out of place (a device-to-device copy of send into recv); the in-place call's time is the
    // per-call overhead. Several ranks: in place, busbw as nccl-tests defines it.
    const bool one_rank = gpus == 1;
    const double bus = gpus > 1 ? 2.0 * (gpus - 1) / gpus : 1.0;
    std::printf("# ddp::nccl all_reduce vs ncclAllReduce, float sum %s, %d rank(s), one GPU each\n# command: %s\n",
                one_rank ? "out of place (one rank: a copy; in place NCCL does nothing)" : "in place", gpus,
                bench::command_line(argc, argv).c_str());
    if (one_rank)
      std::printf("%12s %12s %12s %14s %14s %8s %16s\n", "size(B)", "raw(us)", "ddp(us)", "raw copy", "ddp copy",
                  "ddp/raw", "ddp in-place(us)");
    else
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
        auto out = one_rank ? ddp::cuda::device_vector<float>::zeros(dev, v.size()) : ddp::cuda::device_vector<float>();
        float* recv = one_rank ? out.data() : v.data();
        const ddp::mutable_buffer buf{v.data(), v.size(), ddp::dtype::f32};
        const ddp::mutable_buffer recv_buf{recv, v.size(), ddp::dtype::f32};
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
          ddp::nccl::check(ncclAllReduce(v.data(), recv, v.size(), ncclFloat32, ncclSum, raw_comm, raw_stream.get()),
                           "ncclAllReduce", host.rank(), raw_comm);
          raw_stream.synchronize();
        };
        auto wrapped = [&] {
          comm.all_reduce(buf, recv_buf, ddp::reduce_op::sum).wait();
          dev.synchronize();
        };
        auto in_place = [&] {
          comm.all_reduce(buf, buf, ddp::reduce_op::sum).wait();
          dev.synchronize();
        };
        raw(), wrapped();  // warm-up
        double best_raw = 1e30, best_ddp = 1e30, best_in_place = 1e30;
        for (int rep = 0; rep < 3; ++rep) {
          best_raw = std::min(best_raw, time(raw));
          best_ddp = std::min(best_ddp, time(wrapped));
          if (one_rank) best_in_place = std::min(best_in_place, time(in_place));
        }
        if (host.rank() == 0 && one_rank) {
          const double raw_copy = static_cast<double>(bytes) / best_raw / 1e9;
          const double ddp_copy = static_cast<double>(bytes) / best_ddp / 1e9;
          std::printf("%12zu %12.1f %12.1f %9.2f GB/s %9.2f GB/s %7.0f%% %16.1f\n", bytes, best_raw * 1e6,
                      best_ddp * 1e6, raw_copy, ddp_copy, 100 * ddp_copy / raw_copy, best_in_place * 1e6);
          std::fflush(stdout);
        } else if (host.rank() == 0) {
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
