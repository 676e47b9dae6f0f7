// ddp-bench without the GPU build: --backend nccl says where it is.
#include <stdexcept>

#include "ddp_bench/commands.hpp"

namespace bench {

long long run_collective_nccl(const collective_params&, report&) {
  throw std::invalid_argument("--backend nccl needs the GPU build: cmake --build build --target ddp_gpu, then "
                              "build/bench/ddp-bench-gpu collective --backend nccl");
}

gpu_versions find_gpu_versions() { return {}; }

}  // namespace bench
