#pragma once
// Metrics for logging (pitfall P6): sums and counts reduced over every rank, so rank 0 logs the
// global mean instead of its own shard's.
#include <string>

namespace ddp {

struct metric {
  double sum = 0.0;
  double count = 0.0;

  void add(double value, double n = 1.0) {
    sum += value;
    count += n;
  }
  double mean() const { return count > 0 ? sum / count : 0.0; }
};

// How much of one step's gradient reduction ran while backward was still computing.
struct overlap_timing {
  double reduction_seconds = 0.0;   // sum over buckets of (finish - start)
  double overlapped_seconds = 0.0;  // the part of it before the last backward returned
  double fraction() const {
    return reduction_seconds > 0 ? overlapped_seconds / reduction_seconds : 0.0;
  }
};

}  // namespace ddp
