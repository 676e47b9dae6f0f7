// The NCCL and staged snippets of docs/backends.md and the step graph of docs/cuda.md, compiled by the ddp_gpu target (CUDA toolkit, NCCL).
#include <ddp/nn/cuda/cross_entropy.hpp>
#include <ddp/nn/cuda/linear.hpp>
#include <ddp/nn/cuda/relu.hpp>
#include <ddp/comm/staged_communicator.hpp>
#include <ddp/cuda/step_graph.hpp>
#include <ddp/ddp.hpp>
#include <ddp/nccl/communicator.hpp>
#include <ddp/nn/sequential.hpp>

namespace snippets {

namespace g = ddp::nn::cuda;
using gpu_model = ddp::nn::sequential<g::linear, g::relu, g::linear>;
inline gpu_model make_gpu_model(ddp::cuda::device& dev, std::uint64_t seed) {
  return gpu_model(g::linear(dev, 784, 128, seed), g::relu(), g::linear(dev, 128, 10, seed + 1));
}

void nccl_ranks(int n_gpus, std::uint64_t seed, const ddp::optim::sgd& opt, const std::vector<g::matrix>& inputs,
                const std::vector<ddp::cuda::device_vector<std::int32_t>>& labels) {
  // [doc: backends.md]
  #include <ddp/ddp.hpp>
  #include <ddp/nn/cuda/cross_entropy.hpp>
  #include <ddp/nccl/communicator.hpp>

  ddp::inproc::launch(n_gpus, [&](ddp::inproc::communicator& host) {   // or ddp::mpi::communicator
    ddp::cuda::device dev(host.rank(), host.rank());          // GPU ordinal, rank (for messages)
    auto comm = ddp::nccl::bootstrap(host, dev);               // rank 0's ncclUniqueId, broadcast by host
    auto m = make_gpu_model(dev, seed);                        // ddp::nn::cuda layers, or your module
    ddp::trainer<gpu_model, ddp::use_communicator<ddp::nccl::communicator>,
                 ddp::use_device<ddp::cuda::device>> trainer(m, comm, dev, opt);
    for (std::size_t i = 0; i < inputs.size(); ++i)            // batches already on this GPU
      trainer.step([&](auto& r) { r.backward(g::softmax_cross_entropy(r.forward(inputs[i]), labels[i]).grad); });
  });
  // [end doc]
}

void one_gpu_ranks(std::uint64_t seed, const ddp::optim::sgd& opt) {
  // [doc: backends.md]
  #include <ddp/comm/staged_communicator.hpp>
  #include <ddp/cuda/device.hpp>
  #include <ddp/inproc/launch.hpp>

  ddp::inproc::launch(2, [&](ddp::inproc::communicator& host) {
    ddp::cuda::device dev(0, host.rank());  // both ranks on GPU 0
    ddp::comm::staged_communicator<ddp::inproc::communicator, ddp::cuda::device> comm(host, dev);
    auto m = make_gpu_model(dev, seed);
    ddp::trainer<gpu_model, ddp::use_communicator<decltype(comm)>, ddp::use_device<ddp::cuda::device>>
        trainer(m, comm, dev, opt);
  });
  // [end doc]
}

struct host_batch {
  std::vector<float> x;
  std::vector<std::int32_t> y;
};

template <class Trainer>
void captured_steps(Trainer& trainer, ddp::cuda::device& dev, g::matrix& x, ddp::cuda::device_vector<std::int32_t>& y,
                    const std::vector<host_batch>& batches) {
  // [doc: cuda.md]
  #include <ddp/cuda/step_graph.hpp>

  ddp::cuda::step_graph graph(trainer, [&](auto& replica) {           // x, y: device buffers
    replica.backward(ddp::nn::cuda::softmax_cross_entropy_gradient(replica.forward(x), y));
  });                                           // one ordinary step (warm-up), then the capture
  for (const auto& b : batches) {
    dev.copy_from_host(x.data(), b.x.data(), b.x.size() * sizeof(float));   // the same buffers
    dev.copy_from_host(y.data(), b.y.data(), b.y.size() * sizeof(std::int32_t));
    graph.replay();                                                     // one more step
  }
  // [end doc]
}

using nccl_trainer = ddp::trainer<gpu_model, ddp::use_communicator<ddp::nccl::communicator>,
                                  ddp::use_device<ddp::cuda::device>>;
template void captured_steps<nccl_trainer>(nccl_trainer&, ddp::cuda::device&, g::matrix&,
                                           ddp::cuda::device_vector<std::int32_t>&, const std::vector<host_batch>&);

}  // namespace snippets
