// ddp-bench collective --backend nccl (the GPU build, ddp-bench-gpu): one in-process rank per
// GPU, buffers in device memory, and cudaMemcpy device to device of the same bytes as the
// baseline. Each call is timed as the trainer uses it: launched, then waited for on the device
// (wait() and the compute stream). One GPU: NCCL does nothing for an in-place all_reduce, so
// only the out-of-place columns (a copy) measure bandwidth; the in-place time is the per-call
// overhead.
#include <nccl.h>

#include <cstdio>
#include <memory>

#include "ddp_bench/commands.hpp"
#include "ddp/cuda/device.hpp"
#include "ddp/cuda/device_vector.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/nccl/communicator.hpp"

namespace bench {
namespace {

struct device_memory {
  ddp::cuda::device& dev;
  struct array {
    ddp::cuda::device_vector<std::uint8_t> bytes;
    void* data() { return bytes.data(); }
    const void* data() const { return bytes.data(); }
  };
  array allocate(std::size_t n) { return {ddp::cuda::device_vector<std::uint8_t>::zeros(dev, n)}; }
  void upload(array& a, const void* src, std::size_t n) { dev.copy_from_host(a.data(), src, n); }
  void download(void* dst, const array& a, std::size_t n) { dev.copy_to_host(dst, a.data(), n); }
  void synchronize() { dev.synchronize(); }
};

std::string version(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

}  // namespace

gpu_versions find_gpu_versions() {
  int driver = 0, runtime = 0, nccl = 0;
  cudaDriverGetVersion(&driver);  // 0 where no driver is installed
  cudaRuntimeGetVersion(&runtime);
  ncclGetVersion(&nccl);
  return {driver ? version(driver) : "none", version(runtime),
          std::to_string(nccl / 10000) + "." + std::to_string(nccl / 100 % 100) + "." + std::to_string(nccl % 100)};
}

int run_collective_nccl(const collective_params& p, report& out) {
  const int gpus = p.ranks;
  if (gpus > ddp::cuda::device_count())
    throw std::invalid_argument("--ranks " + std::to_string(gpus) + ": this machine has " +
                                std::to_string(ddp::cuda::device_count()) + " GPU(s); NCCL takes one rank per GPU");
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const auto v = find_gpu_versions();
  set_gpu_info(prop.name, v.driver, v.cuda_runtime, v.nccl);
  out.begin(true);
  ddp::inproc::launch(gpus, [&](ddp::inproc::communicator& host) {
    ddp::cuda::device dev(host.rank(), host.rank());
    auto comm = ddp::nccl::bootstrap(host, dev);
    device_memory mem{dev};
    const baseline_fn baseline = [&](collective_kind, ddp::dtype type, ddp::reduce_op, call_shape shape, void* send,
                                     void* recv) {
      const std::size_t bytes = std::max(shape.send, shape.recv) * ddp::size_of(type);
      using bytes_vector = ddp::cuda::device_vector<std::uint8_t>;
      auto a = std::make_shared<bytes_vector>(bytes_vector::zeros(dev, std::max<std::size_t>(bytes, 1)));
      auto b = std::make_shared<bytes_vector>(bytes_vector::zeros(dev, a->size()));
      (void)send, (void)recv;
      return bench::baseline{.call = [a, b, bytes, &dev] {
        ddp::cuda::check(cudaMemcpyAsync(b->data(), a->data(), bytes, cudaMemcpyDeviceToDevice, dev.stream()),
                         "cudaMemcpyAsync", dev.site());
        dev.synchronize();
      }};
    };
    run_sweep(comm, host, mem, p, baseline, out);
  });
  return 0;
}

}  // namespace bench
