#pragma once
// Reductions a layer can run across ranks (synchronised batch statistics).
#include <span>

#include "ddp/comm/collectives.hpp"

namespace ddp::nn {

// A function that sums a host vector over every rank of `comm`, in place. Host communicators.
template <communicator C>
auto sum_over_ranks(C& comm) {
  static_assert(C::memory_kind == device_kind::cpu,
                "ddp::nn::sum_over_ranks: the nn layers keep host tensors; use a host communicator");
  return [&comm](std::span<double> values) { ddp::comm::all_reduce(comm, values, reduce_op::sum); };
}

}  // namespace ddp::nn
