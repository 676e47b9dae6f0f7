#pragma once
// The virtual shards of a step (ddp::reduction::invariant<V>): the global batch of B samples is
// V shards of B / V consecutive samples, shard s at positions [s * B / V, (s + 1) * B / V), and
// rank r of `world` runs shards [first, last) of them as its micro-batches, in order. Every shard
// is the same samples in the same order at every world size, and its gradients the same bits on
// whichever rank runs it; the ranks hold floor or ceil of V / world shards each.
//
//   const auto mine = ddp::sampler::virtual_shards(V, comm.rank(), comm.size());
//   for (std::size_t s = mine.first; s < mine.last; ++s) {
//     auto batch = global_batch.rows(mine.begin(s, B), mine.end(s, B));
//     if (s + 1 < mine.last) trainer.accumulate(f(batch)); else trainer.step(f(batch));
//   }
#include <cstddef>
#include <string>

#include "ddp/core/error.hpp"

namespace ddp::sampler {

struct shard_range {
  std::size_t shards = 0;  // V
  std::size_t first = 0, last = 0;

  std::size_t size() const noexcept { return last - first; }
  // Shard s's positions in a global batch of `batch` samples, a multiple of the shard count (every
  // shard the same shape, no sample left out).
  std::size_t begin(std::size_t s, std::size_t batch) const { return s * shard_size(batch); }
  std::size_t end(std::size_t s, std::size_t batch) const { return (s + 1) * shard_size(batch); }
  std::size_t shard_size(std::size_t batch) const {
    if (shards == 0 || batch % shards != 0)
      throw error("sampler", "virtual_shards", -1,
                  "a global batch of " + std::to_string(batch) + " samples does not cut into " +
                      std::to_string(shards) + " shards of one shape: choose a global batch that is a multiple of " +
                      std::to_string(shards));
    return batch / shards;
  }
};

inline shard_range virtual_shards(std::size_t shards, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world)
    throw error("sampler", "virtual_shards", rank,
                "rank " + std::to_string(rank) + " is outside a world of " + std::to_string(world) +
                    " (pass comm.rank() and comm.size())");
  const auto w = static_cast<std::size_t>(world), r = static_cast<std::size_t>(rank);
  if (shards < w)
    throw error("sampler", "virtual_shards", rank,
                "a world of " + std::to_string(world) + " ranks cannot hold " + std::to_string(shards) +
                    " virtual shards, one at least per rank: run at most " + std::to_string(shards) +
                    " ranks, or choose more shards (reduction::invariant<V>)");
  return {shards, r * shards / w, (r + 1) * shards / w};
}

}  // namespace ddp::sampler
