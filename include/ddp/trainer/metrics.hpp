#pragma once
// Metrics for logging (pitfall P6): sums and counts reduced over every rank, so rank 0 logs the
// global mean instead of its own shard's.
#include <array>
#include <cstddef>
#include <span>
#include <string>

#include "ddp/comm/host_collectives.hpp"
#include "ddp/core/reduce_op.hpp"

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

namespace detail {
inline void add_metrics(metric& total, const metric& m) { total.add(m.sum, m.count); }
template <std::size_t N>
void add_metrics(std::array<metric, N>& total, const std::array<metric, N>& m) {
  for (std::size_t i = 0; i < N; ++i) total[i].add(m[i].sum, m[i].count);
}

// Global sums of per-rank metrics: every rank gets the same values (pitfall P6, logging one
// rank's mean). Collective.
template <class Comm, class Device, std::size_t N>
std::array<metric, N> reduce_metrics(Comm& comm, Device& dev, std::array<metric, N> local) {
  std::array<double, 2 * N> flat;
  for (std::size_t i = 0; i < N; ++i) flat[2 * i] = local[i].sum, flat[2 * i + 1] = local[i].count;
  comm::host_all_reduce(comm, dev, std::span<double>(flat), reduce_op::sum);
  for (std::size_t i = 0; i < N; ++i) local[i] = {flat[2 * i], flat[2 * i + 1]};
  return local;
}
}  // namespace detail

// How much of one step's gradient reduction ran while backward was still computing. `measured` is
// false when the communicator's work handles carry no timing (ddp::timed_work_handle: NCCL's run
// on a stream and do not), and the figures are then meaningless, not zero.
struct overlap_timing {
  bool measured = false;
  double reduction_seconds = 0.0;   // sum over buckets of (finish - start)
  double overlapped_seconds = 0.0;  // the part of it before the last backward returned
  double fraction() const {
    return reduction_seconds > 0 ? overlapped_seconds / reduction_seconds : 0.0;
  }
};

}  // namespace ddp
