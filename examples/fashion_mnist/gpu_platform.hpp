#pragma once
// The example on GPUs: the same model from the CUDA reference layers (cuBLAS), one GPU per rank,
// NCCL between them, bootstrapped by the launcher's host communicator (in-process threads: rank r
// uses GPU r; mpirun or srun: the process's local rank picks its GPU); or, with --backend staged,
// several in-process ranks on one GPU.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "config.hpp"
#include "ddp/comm/staged_communicator.hpp"
#include "ddp/inproc/communicator.hpp"

#include "ddp/nn/cuda/batch_norm.hpp"
#include "ddp/nn/cuda/cross_entropy.hpp"
#include "ddp/nn/cuda/linear.hpp"
#include "ddp/cuda/linalg.hpp"
#include "ddp/nn/cuda/relu.hpp"
#include "ddp/nccl/communicator.hpp"
#include "ddp/nn/sequential.hpp"

namespace fmnist {

namespace g = ddp::nn::cuda;

// The ranks' communicator on GPUs: NCCL, one rank per GPU; or, with --backend staged, several
// in-process ranks sharing the GPUs there are (rank r on GPU r mod count), their collectives
// through host memory (ddp::comm::staged_communicator), since NCCL refuses two ranks on one GPU. One
// type for both, chosen when the run starts, and the same under mpirun (NCCL there), so that the
// example's policy combinations compile against one trainer core.
class gpu_communicator {
 public:
  using staged = ddp::comm::staged_communicator<ddp::inproc::communicator, ddp::cuda::device>;
  static constexpr ddp::device_kind memory_kind = ddp::device_kind::cuda;
  static constexpr std::string_view backend_name = "nccl|staged";

  explicit gpu_communicator(ddp::nccl::communicator nccl) : comm_(std::move(nccl)) {}
  gpu_communicator(ddp::inproc::communicator& host, ddp::cuda::device& dev)
      : comm_(std::in_place_type<staged>, host, dev) {}

  class work {
   public:
    template <class W>
    explicit work(W w) : w_(std::move(w)) {}
    void wait() {
      std::visit([](auto& w) { w.wait(); }, w_);
    }
    bool test() const noexcept {
      return std::visit([](const auto& w) { return w.test(); }, w_);
    }
    void rethrow_failure() const {
      std::visit([](const auto& w) { ddp::rethrow_failure(w); }, w_);
    }

   private:
    std::variant<ddp::nccl::work, ddp::comm::staged_work> w_;
  };

  int rank() const {
    return std::visit([](const auto& c) { return c.rank(); }, comm_);
  }
  int size() const {
    return std::visit([](const auto& c) { return c.size(); }, comm_);
  }
  work all_reduce(ddp::const_buffer send, ddp::mutable_buffer recv, ddp::reduce_op op) {
    return std::visit([&](auto& c) { return work(c.all_reduce(send, recv, op)); }, comm_);
  }
  work broadcast(ddp::mutable_buffer buf, int root) {
    return std::visit([&](auto& c) { return work(c.broadcast(buf, root)); }, comm_);
  }
  work all_gather(ddp::const_buffer send, ddp::mutable_buffer recv) {
    return std::visit([&](auto& c) { return work(c.all_gather(send, recv)); }, comm_);
  }
  work reduce_scatter(ddp::const_buffer send, ddp::mutable_buffer recv, ddp::reduce_op op) {
    return std::visit([&](auto& c) { return work(c.reduce_scatter(send, recv, op)); }, comm_);
  }
  work barrier() {
    return std::visit([](auto& c) { return work(c.barrier()); }, comm_);
  }
  void abort(const std::string& reason) {
    std::visit([&](auto& c) { c.abort(reason); }, comm_);
  }

 private:
  std::variant<ddp::nccl::communicator, staged> comm_;
};

struct gpu_platform {
  static constexpr const char* name = "cuda";
  using device = ddp::cuda::device;
  using model = ddp::nn::sequential<g::linear, g::batch_norm, g::relu, g::linear, g::batch_norm, g::relu, g::linear>;
  template <class Launcher>
  using communicator = gpu_communicator;

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
  static void on_rank(Launcher& launcher, const config& c, F&& f) {
    if constexpr (std::is_same_v<Launcher, ddp::inproc::communicator>)
      if (c.backend == "staged") {
        device dev(launcher.rank() % ddp::cuda::device_count(), launcher.rank());
        gpu_communicator comm(launcher, dev);
        f(comm, dev);
        return;
      }
    int ordinal = launcher.rank();
    if constexpr (requires { launcher.local_rank(); }) ordinal = launcher.local_rank();
    device dev(ordinal, launcher.rank());
    gpu_communicator comm(ddp::nccl::bootstrap(launcher, dev));
    f(comm, dev);
  }
};

}  // namespace fmnist
