#pragma once
// Update: how the optimizer step is spread over the ranks.
//
//   replicated  (default) every rank all-reduces every gradient and updates every parameter, as
//               PyTorch's DistributedDataParallel does; each rank keeps the whole optimizer state.
//   sharded     each bucket is cut into N equal shards. Rank r receives shard r of the averaged
//               gradient (reduce_scatter), updates the parameters in that shard with that
//               shard's optimizer state, and the ranks all-gather the updated parameters (ZeRO
//               stage 1, PyTorch's ZeroRedundancyOptimizer). Every element goes through the same
//               arithmetic as under replicated, so the parameters are bitwise the same; each
//               rank runs 1/N of the optimizer, keeps 1/N of its state, and the two collectives
//               move the bytes of one all_reduce. A module that binds parameter storage
//               (`bind_parameter`) keeps its parameters in the gathered memory; otherwise the
//               trainer copies them in and out once per step.
#include <string_view>

#include "ddp/policy/slots.hpp"

namespace ddp::update {

struct slot;

struct replicated {
  using slot = update::slot;
  static constexpr std::string_view name = "replicated";
};
struct sharded {
  using slot = update::slot;
  static constexpr std::string_view name = "sharded";
};

struct slot {
  static constexpr std::string_view name = "update";
  using default_policy = replicated;
};

}  // namespace ddp::update
