#pragma once
// One rank's share of an epoch, as a sampler deals it and trainer.epoch() hands it to a loader:
// the rank's indices in the epoch's order, and how many of every rank's indices are real samples.
// A sampler that pads (repeats samples so every rank gets as many) puts the repeats at the end of
// each rank's list.
#include <cstddef>
#include <utility>
#include <vector>

namespace ddp {

struct shard {
  std::vector<std::size_t> indices;
  std::vector<std::size_t> real_counts;  // one per rank
  int rank = 0;
  bool keep_partial_batch = false;  // the sampler visits every sample: a short last batch stays

  int world() const noexcept { return static_cast<int>(real_counts.size()); }
  std::size_t real_count() const { return real_counts.at(static_cast<std::size_t>(rank)); }

  // Indices that are all real samples, on one rank (a loader's batches outside a trainer).
  static shard of_indices(std::vector<std::size_t> indices, bool keep_partial_batch = false) {
    const std::size_t n = indices.size();
    return {std::move(indices), {n}, 0, keep_partial_batch};
  }
};

}  // namespace ddp
