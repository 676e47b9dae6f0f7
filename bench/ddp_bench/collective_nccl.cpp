// ddp-bench collective --backend nccl (the GPU build, ddp-bench-gpu): one in-process rank per
// GPU, buffers in device memory, and cudaMemcpy device to device of the same bytes as the
// baseline. Each call is timed as the trainer uses it: launched, then waited for on the device
// (wait() and the compute stream). One GPU: an in-place call has nothing to move, so the sweep
// reads its time and bandwidth n/a (its result is still checked); the out-of-place columns (a
// copy) measure bandwidth.
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

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

// NCCL's version code (NCCL_VERSION: major * 10000 + minor * 100 + patch from 2.9 on).
std::string nccl_version(int v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

// The paths of the shared libraries this process mapped whose names begin with one of `names`.
std::vector<std::string> mapped_libraries(std::initializer_list<std::string_view> names) {
  std::vector<std::string> found;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string_view file = std::string_view(path).substr(path.rfind('/') + 1);
    for (const auto name : names)
      if (file.starts_with(name) && std::find(found.begin(), found.end(), path) == found.end()) found.push_back(path);
  }
  return found;
}

}  // namespace

gpu_versions find_gpu_versions() {
  int driver = 0, runtime = 0, nccl = 0, devices = 0;
  cudaDriverGetVersion(&driver);  // 0 where no driver is installed
  cudaRuntimeGetVersion(&runtime);
  ncclGetVersion(&nccl);
  gpu_versions v;
  v.driver = driver ? version(driver) : "none";
  v.cuda_runtime = version(runtime);
  v.nccl = nccl_version(nccl);
  // NCCL runs a program with the library it was built against or a newer one; an older library
  // may lack what the build's nccl.h declares (ncclConfig_t's fields, functions). Patch releases
  // keep the interface, so the build needs its header's major.minor.
  constexpr int needed = NCCL_MAJOR * 10000 + NCCL_MINOR * 100;
  v.nccl_built = nccl_version(NCCL_VERSION_CODE);
  v.nccl_needed = nccl_version(needed);
  const cudaError_t counted = cudaGetDeviceCount(&devices);
  v.devices = counted == cudaSuccess ? std::to_string(devices)
                                     : "none (cudaGetDeviceCount: " + std::string(cudaGetErrorString(counted)) + ")";
  v.loaded = mapped_libraries({"libnccl", "libcudart", "libcublas", "libcuda."});
  auto nccl_path = std::find_if(v.loaded.begin(), v.loaded.end(),
                                [](const std::string& p) { return p.find("/libnccl") != std::string::npos; });
  const std::string from = nccl_path == v.loaded.end() ? std::string() : " (" + *nccl_path + ")";
  if (nccl < needed)
    v.problems.push_back("the NCCL library loaded" + from + " is " + v.nccl + ", older than the " + v.nccl_needed +
                         " this build needs (compiled against nccl.h " + v.nccl_built + "): put a libnccl.so.2 of " +
                         v.nccl_needed + " or newer first on LD_LIBRARY_PATH");
  if (driver != 0 && runtime > driver)
    v.problems.push_back("the CUDA runtime loaded is " + v.cuda_runtime + ", newer than the CUDA " + v.driver +
                         " this driver supports: put a libcudart.so of CUDA " + v.driver +
                         " or older first on LD_LIBRARY_PATH, or update the driver");
  return v;
}

long long run_collective_nccl(const collective_params& p, report& out) {
  const int gpus = p.ranks;
  if (gpus > ddp::cuda::device_count())
    throw std::invalid_argument("--ranks " + std::to_string(gpus) + ": this machine has " +
                                std::to_string(ddp::cuda::device_count()) + " GPU(s); NCCL takes one rank per GPU");
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const auto v = find_gpu_versions();
  set_gpu_info(prop.name, v.driver, v.cuda_runtime, v.nccl);
  out.begin(true);
  long long wrong = 0;
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
    const long long found = run_sweep(comm, host, mem, p, baseline, out);  // the same on every rank
    if (host.rank() == 0) wrong = found;
  });
  return wrong;
}

}  // namespace bench
