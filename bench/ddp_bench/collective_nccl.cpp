// ddp-bench collective --backend nccl (the GPU build, ddp-bench-gpu): one in-process rank per
// GPU, buffers in device memory, and cudaMemcpy device to device of the same bytes as the
// baseline. Each call is timed as the trainer uses it: launched, then waited for on the device
// (wait() and the compute stream; -z 0: once per batch; -G N: a batch captured into a CUDA graph
// and launched N times). One GPU: an in-place call has nothing to move, so the sweep
// reads its time and bandwidth n/a (its result is still checked); the out-of-place columns (a
// copy) measure bandwidth.
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ddp_bench/commands.hpp"
#include "ddp/cuda/device.hpp"
#include "ddp/cuda/device_vector.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/nccl/communicator.hpp"

namespace bench {
namespace {

// The sweep's buffers in device memory; with the communicator set, batches of calls captured
// into CUDA graphs (-G), and the device memory in use (-M).
struct device_memory {
  ddp::cuda::device& dev;
  ddp::nccl::communicator* comm = nullptr;
  struct array {
    ddp::cuda::device_vector<std::uint8_t> bytes;
    void* data() { return bytes.data(); }
    const void* data() const { return bytes.data(); }
  };
  array allocate(std::size_t n) { return {ddp::cuda::device_vector<std::uint8_t>::zeros(dev, n)}; }
  void upload(array& a, const void* src, std::size_t n) { dev.copy_from_host(a.data(), src, n); }
  void download(void* dst, const array& a, std::size_t n) { dev.copy_to_host(dst, a.data(), n); }
  void synchronize() { dev.synchronize(); }

  // `calls` calls of `issue` captured on the compute stream into one graph; the function returned
  // launches it `launches` times (each launch watched as one collective, as ddp::cuda::step_graph
  // does) and waits for the device.
  std::function<void()> capture(const std::function<void()>& issue, int calls, int launches) {
    dev.activate();
    cudaGraph_t graph = nullptr;
    ddp::cuda::check(cudaStreamBeginCapture(dev.stream(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture",
                     dev.site());
    try {
      for (int i = 0; i < calls; ++i) issue();
    } catch (...) {
      cudaStreamEndCapture(dev.stream(), &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    const cudaError_t ended = cudaStreamEndCapture(dev.stream(), &graph);
    if (ended != cudaSuccess || !graph) {
      if (graph) cudaGraphDestroy(graph);
      ddp::cuda::check(ended == cudaSuccess ? cudaErrorStreamCaptureInvalidated : ended,
                       "cudaStreamEndCapture (ddp-bench -G: a batch of calls)", dev.site());
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    ddp::cuda::check(made, "cudaGraphInstantiate (ddp-bench -G)", dev.site());
    auto owned = std::shared_ptr<std::remove_pointer_t<cudaGraphExec_t>>(exec, [stream = dev.stream()](cudaGraphExec_t e) {
      cudaStreamSynchronize(stream);  // a graph may not go while it runs
      cudaGraphExecDestroy(e);
    });
    ddp::cuda::check(cudaGraphUpload(exec, dev.stream()), "cudaGraphUpload (ddp-bench -G)", dev.site());
    return [this, owned, launches] {
      std::optional<ddp::nccl::work> last;
      for (int i = 0; i < launches; ++i)
        last = comm->watch("ddp-bench -G batch", [&] {
          ddp::cuda::check(cudaGraphLaunch(owned.get(), dev.stream()), "cudaGraphLaunch (ddp-bench -G)", dev.site());
        });
      dev.synchronize();
      if (last) last->rethrow_failure();
    };
  }

  double device_used_bytes() {
    dev.activate();
    std::size_t free = 0, total = 0;
    ddp::cuda::check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo", dev.site());
    return static_cast<double>(total - free);
  }
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

sweep_result run_collective_nccl(const collective_params& p, report& out) {
  const int gpus = p.ranks;
  if (gpus > ddp::cuda::device_count())
    throw std::invalid_argument("--ranks " + std::to_string(gpus) + ": this machine has " +
                                std::to_string(ddp::cuda::device_count()) + " GPU(s); NCCL takes one rank per GPU");
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const auto v = find_gpu_versions();
  set_gpu_info(prop.name, v.driver, v.cuda_runtime, v.nccl);
  out.begin(true);
  sweep_result found;
  ddp::inproc::options host_options;
  host_options.timeout = communicator_timeout(p, host_options.timeout);
  ddp::nccl::options options;
  options.timeout = communicator_timeout(p, options.timeout);
  ddp::inproc::launch(
      gpus,
      [&](ddp::inproc::communicator& host) {
        ddp::cuda::device dev(host.rank(), host.rank());
        auto comm = ddp::nccl::bootstrap(host, dev, options);
        device_memory mem{dev, &comm};
        const baseline_fn baseline = [&](collective_kind, ddp::dtype type, ddp::reduce_op, call_shape shape, void* send,
                                         void* recv) {
          const std::size_t bytes = std::max(shape.send, shape.recv) * ddp::size_of(type);
          using bytes_vector = ddp::cuda::device_vector<std::uint8_t>;
          auto a = std::make_shared<bytes_vector>(bytes_vector::zeros(dev, std::max<std::size_t>(bytes, 1)));
          auto b = std::make_shared<bytes_vector>(bytes_vector::zeros(dev, a->size()));
          (void)send, (void)recv;
          // Queued only: the sweep waits for the device as -z says (and -G captures it).
          return bench::baseline{.call = [a, b, bytes, &dev] {
            ddp::cuda::check(cudaMemcpyAsync(b->data(), a->data(), bytes, cudaMemcpyDeviceToDevice, dev.stream()),
                             "cudaMemcpyAsync", dev.site());
          }};
        };
        const sweep_result mine = run_sweep(comm, host, mem, p, baseline, out);  // the same on every rank
        if (host.rank() == 0) found = mine;
      },
      host_options);
  return found;
}

std::vector<bits_row> check_bits_nccl(const collective_params& p, std::size_t count, std::vector<std::string>& notes) {
  int gpus = 0;
  try {
    gpus = ddp::cuda::device_count();
  } catch (const std::exception& e) {
    notes.push_back(std::string("nccl: not run: ") + e.what());
    return {};
  }
  std::vector<bits_row> rows;
  for (const int n : p.rank_list) {
    if (n > gpus) {
      notes.push_back("nccl: not run at " + std::to_string(n) + " ranks: this machine has " + std::to_string(gpus) +
                      " GPU(s), one per rank");
      continue;
    }
    bits_row row;
    ddp::inproc::launch(n, [&](ddp::inproc::communicator& host) {
      ddp::cuda::device dev(host.rank(), host.rank());
      auto comm = ddp::nccl::bootstrap(host, dev);
      const bits_row mine = reduce_seeded(comm, host, dev, p, count);
      if (host.rank() == 0) row = mine;
    });
    row.backend = "nccl";
    rows.push_back(row);
  }
  return rows;
}

bool has_cuda_graphs() { return true; }

}  // namespace bench
