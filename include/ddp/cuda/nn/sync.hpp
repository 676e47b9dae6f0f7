#pragma once
// Synchronised batch statistics on GPUs: the reduction a ddp::cuda::nn::batch_norm runs across
// ranks, through any communicator (NCCL stages the values through the device).
//   bn.synchronize_statistics(ddp::cuda::nn::sum_over_ranks(comm, dev));
#include <span>

#include "ddp/concepts/communicator.hpp"
#include "ddp/cuda/device.hpp"
#include "ddp/trainer/host_collectives.hpp"

namespace ddp::cuda::nn {

template <communicator C>
auto sum_over_ranks(C& comm, cuda::device& dev) {
  return [&comm, &dev](std::span<double> values) { ddp::detail::host_all_reduce(comm, dev, values, reduce_op::sum); };
}

}  // namespace ddp::cuda::nn
