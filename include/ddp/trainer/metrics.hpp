#pragma once
// Metrics for logging (pitfall P6): sums and counts reduced over every rank, so rank 0 logs the
// global mean instead of its own shard's.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "ddp/comm/host_collectives.hpp"
#include "ddp/core/reduce_op.hpp"
#include "ddp/policy/reduction.hpp"

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

// A metric whose sum and count are exact (reduction::exact::double_sum): trainer.reduce() gives
// the same bits however its terms were spread over the ranks and in whatever order they were
// added, which a double's sum does not. The metric to log under reduction::invariant, where the
// ranks hold other virtual shards at another world size.
class exact_metric {
 public:
  void add(double value, double n = 1.0) noexcept {
    sum_.add(value);
    count_.add(n);
  }
  double sum() const noexcept { return sum_.value(); }
  double count() const noexcept { return count_.value(); }
  double mean() const noexcept {
    const double c = count();
    return c > 0 ? sum() / c : 0.0;
  }
  // Explicit: reducing the converted metric would sum rounded doubles, not the exact words.
  explicit operator metric() const noexcept { return {sum(), count()}; }

  // The exact words, for the reduction over ranks (summed as integers, then normalised).
  policy::reduction::exact::double_sum& sum_words() noexcept { return sum_; }
  policy::reduction::exact::double_sum& count_words() noexcept { return count_; }

 private:
  policy::reduction::exact::double_sum sum_, count_;
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
// The same for exact metrics: their words summed as integers (exact in any order), then normalised.
template <class Comm, class Device, std::size_t N>
std::array<exact_metric, N> reduce_metrics(Comm& comm, Device& dev, std::array<exact_metric, N> local) {
  using words = policy::reduction::exact::double_sum::words;
  constexpr std::size_t w = std::tuple_size_v<words>;
  std::vector<std::int64_t> flat(2 * N * w);
  for (std::size_t i = 0; i < N; ++i) {
    local[i].sum_words().normalize();
    local[i].count_words().normalize();
    std::copy_n(local[i].sum_words().data().begin(), w, flat.begin() + static_cast<std::ptrdiff_t>((2 * i) * w));
    std::copy_n(local[i].count_words().data().begin(), w, flat.begin() + static_cast<std::ptrdiff_t>((2 * i + 1) * w));
  }
  comm::host_all_reduce(comm, dev, std::span<std::int64_t>(flat), reduce_op::sum);
  for (std::size_t i = 0; i < N; ++i) {
    std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>((2 * i) * w), w, local[i].sum_words().data().begin());
    std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>((2 * i + 1) * w), w, local[i].count_words().data().begin());
    local[i].sum_words().normalize();
    local[i].count_words().normalize();
  }
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
