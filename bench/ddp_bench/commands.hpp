#pragma once
// ddp-bench's subcommands, one translation unit each; main.cpp parses the flags (CLI11) and calls
// one of them. Each returns the process's exit code.
#include <cstddef>
#include <string>
#include <vector>

#include "collective_sweep.hpp"
#include "ddp_bench/check_bits.hpp"

namespace bench {

// The exit status is 1 when any checked element was wrong or a size ran past -T
// (bench/collective_sweep.hpp).
int run_collective(const collective_params& p);
// --check bits: one row per backend and world size (in-process at each of --ranks; MPI's world
// under mpirun; NCCL at each that has enough GPUs, in the GPU build); exit status 1 unless every
// row holds the same bits (ddp_bench/check_bits.hpp).
int run_check_bits(const collective_params& p);
// --backend nccl: collective_nccl.cpp in ddp-bench-gpu (the GPU build); no_nccl.cpp in ddp-bench
// says where to find it. Returns what the sweep found (run_sweep).
sweep_result run_collective_nccl(const collective_params& p, report& out);
// --check bits over NCCL at each world size of p.rank_list that this machine has the GPUs for;
// `notes` says which it could not run, and why.
std::vector<bits_row> check_bits_nccl(const collective_params& p, std::size_t count, std::vector<std::string>& notes);
// Whether this build launches collectives through CUDA graphs (-G: the GPU build).
bool has_cuda_graphs();
// The CUDA driver, CUDA runtime and NCCL versions this binary finds ("" each without the GPU
// build); none needs a GPU. `nccl_built`: the nccl.h the build compiled against, and
// `nccl_needed` the oldest library it runs with; `loaded`: the CUDA and NCCL shared libraries
// this process mapped (their paths); `devices`: what cudaGetDeviceCount says; `problems`: why
// these libraries cannot run this build (an NCCL older than needed, a runtime newer than the
// driver), empty when they can.
struct gpu_versions {
  std::string driver, cuda_runtime, nccl;
  std::string nccl_built, nccl_needed, devices;
  std::vector<std::string> loaded, problems;
};
gpu_versions find_gpu_versions();

struct step_params {
  std::string model = "mlp";          // or gpt, gpt-10m (bench/ddp_bench/gpt_workload.hpp)
  std::vector<int> ranks{1, 2};
  std::size_t params = 1'300'000;     // parameters of the synthetic model
  std::string profile = "flat";       // hidden widths: flat, funnel (2h, h, h/2) or wide (4h, h, h)
  std::size_t batch = 64;             // per rank (sequences for a GPT)
  int steps = 30;                     // timed steps per measurement
  int repeats = 3;                    // alternating batches of each configuration; the best is kept
  std::vector<std::string> vary{"bucket_cap", "buffer_sync", "unused_params", "update", "comm_hook", "reduction"};
  std::string out;
};
int run_step(const step_params& p);

struct scaling_params {
  std::string model = "mlp";  // the Fashion-MNIST example's, or gpt, gpt-10m (synthetic tokens)
  int ranks = 2;
  int rounds = 15;
  int steps = 120;
  std::size_t batch = 64;  // per rank (sequences for a GPT)
  std::string optimizer = "sgd";
  std::vector<std::string> hooks;  // comm_hook set-ups beside the four: bf16, fp16, powersgd
  std::string data_dir;
  std::string out;
};
int run_scaling(const scaling_params& p);

struct invariance_params {
  std::vector<int> ranks{1, 2, 3, 4, 6, 8};
  std::string backend = "inproc";  // or mpi: the world mpirun started
  std::vector<std::string> updates{"replicated", "sharded"};
  std::vector<std::string> optimizers{"sgd", "adamw"};
  std::string reduction = "invariant";  // plain: the same dealing, floating-point average
  int steps = 50;
  std::size_t global_batch = 128;
  std::size_t hidden = 512;
  std::string expect;  // a hash every run must give (--backend mpi: compare with an in-process one)
  std::string lose;    // "R@S": rank R throws in step S, the others go on (in-process, launch_elastic)
  int rejoin = 0;      // with lose: the lost rank joins again that many steps later (0: never)
  std::string data_dir;
  std::string out;
};
int run_invariance(const invariance_params& p);

}  // namespace bench
