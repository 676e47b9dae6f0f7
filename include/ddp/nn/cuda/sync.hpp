#pragma once
// Synchronised batch statistics on GPUs: the reduction a ddp::nn::cuda::batch_norm runs across
// ranks over its per-feature sums, which live in the GPU's memory.
//   bn.synchronize_statistics(ddp::nn::cuda::sum_over_ranks(comm, dev));
// With a communicator of GPU memory (NCCL) the sums are reduced in place, with no copy; with a
// host communicator they go to host memory and back.
#include <span>
#include <vector>

#include "ddp/comm/host_collectives.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/cuda/device.hpp"

namespace ddp::nn::cuda {

template <communicator C>
auto sum_over_ranks(C& comm, ddp::cuda::device& dev) {
  return [&comm, &dev](std::span<double> on_device) {
    if constexpr (C::memory_kind == device_kind::cuda) {
      const mutable_buffer b{on_device.data(), on_device.size(), dtype::f64};
      comm.all_reduce(b, b, reduce_op::sum).wait();
    } else {
      std::vector<double> host(on_device.size());
      dev.copy_to_host(host.data(), on_device.data(), on_device.size_bytes());
      ddp::comm::host_all_reduce(comm, dev, std::span<double>(host), reduce_op::sum);
      dev.copy_from_host(on_device.data(), host.data(), on_device.size_bytes());
    }
  };
}

}  // namespace ddp::nn::cuda
