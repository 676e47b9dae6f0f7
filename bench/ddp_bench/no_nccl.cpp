// ddp-bench without the GPU build: --backend nccl says where it is.
#include <stdexcept>

#include "ddp_bench/commands.hpp"

namespace bench {

sweep_result run_collective_nccl(const collective_params&, report&) {
  throw std::invalid_argument("--backend nccl needs the GPU build: cmake --build build --target ddp_gpu, then "
                              "build/bench/ddp-bench-gpu collective --backend nccl");
}

std::vector<bits_row> check_bits_nccl(const collective_params&, std::size_t, std::vector<std::string>& notes) {
  notes.push_back("nccl: not in this build (build/bench/ddp-bench-gpu, built by the ddp_gpu target, has it)");
  return {};
}

bool has_cuda_graphs() { return false; }

gpu_versions find_gpu_versions() { return {}; }

}  // namespace bench
