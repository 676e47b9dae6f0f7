#pragma once
// The example on GPUs: the same model from the CUDA reference layers (cuBLAS), one GPU per rank,
// NCCL between them, bootstrapped by the launcher's host communicator (in-process threads: rank r
// uses GPU r; mpirun or srun: the process's local rank picks its GPU).
#include <cstdint>
#include <span>

#include "ddp/cuda/nn/batch_norm.hpp"
#include "ddp/cuda/nn/cross_entropy.hpp"
#include "ddp/cuda/nn/linear.hpp"
#include "ddp/cuda/linalg.hpp"
#include "ddp/cuda/nn/relu.hpp"
#include "ddp/nccl/communicator.hpp"
#include "ddp/nn/sequential.hpp"

namespace fmnist {

namespace g = ddp::cuda::nn;

struct gpu_platform {
  static constexpr const char* name = "cuda";
  using device = ddp::cuda::device;
  using model = ddp::nn::sequential<g::linear, g::batch_norm, g::relu, g::linear, g::batch_norm, g::relu, g::linear>;
  template <class Launcher>
  using communicator = ddp::nccl::communicator;

  static model make_model(device& dev, std::uint64_t seed, std::size_t hidden = 512) {
    return model(g::linear(dev, 784, hidden, seed), g::batch_norm(dev, hidden), g::relu(),
                 g::linear(dev, hidden, hidden, seed + 1), g::batch_norm(dev, hidden), g::relu(),
                 g::linear(dev, hidden, 10, seed + 2));
  }
  static g::matrix input(device& dev, const ddp::nn::matrix& x) { return g::matrix::from_host(dev, x); }
  static g::cross_entropy_result loss(device& dev, const g::matrix& logits, std::span<const std::int32_t> labels,
                                      const ddp::sample_weights& weights) {
    return g::softmax_cross_entropy(logits, ddp::cuda::device_vector<std::int32_t>::from_host(dev, labels), weights);
  }
  template <class Launcher, class F>
  static void on_rank(Launcher& launcher, F&& f) {
    int ordinal = launcher.rank();
    if constexpr (requires { launcher.local_rank(); }) ordinal = launcher.local_rank();
    device dev(ordinal, launcher.rank());
    auto comm = ddp::nccl::bootstrap(launcher, dev);
    f(comm, dev);
  }
};

}  // namespace fmnist
