#pragma once
#include <chrono>
#include <concepts>

namespace ddp {

// The handle an asynchronous collective returns.
//   wait(): returns once the collective's result may be used by work the caller issues next
//           (host backends: the data is in place; stream backends: the caller's compute
//           queue is ordered after the collective). Rethrows the collective's failure.
//   test(): true once the collective finished (host backends: wait() would not block); never
//           throws.
template <class W>
concept work_handle = std::movable<W> && requires(W& w) {
  w.wait();
  { w.test() } -> std::same_as<bool>;
};

// Optional capability: when the collective started and finished running (valid once test()).
// Host backends have it; a stream backend (NCCL) does not, and the trainer then reports its
// overlap as unavailable rather than as zero.
template <class W>
concept timed_work_handle = work_handle<W> && requires(const W& w) {
  { w.started() } -> std::convertible_to<std::chrono::steady_clock::time_point>;
  { w.finished() } -> std::convertible_to<std::chrono::steady_clock::time_point>;
};

// Optional capability of a stream backend (NCCL), whose wait() only orders the compute queue: a
// collective aborted after that (a peer died, a timeout) still completes on the queue, and its
// failure reaches the host through rethrow_failure(), called after the host synchronised with
// the queue and before it trusts a value read there. ddp::rethrow_failure(w) calls it where a
// handle has it; a host backend's wait() has already thrown.
template <class W>
concept stream_ordered_work = work_handle<W> && requires(const W& w) { w.rethrow_failure(); };

template <work_handle W>
void rethrow_failure(const W& w) {
  if constexpr (stream_ordered_work<W>) w.rethrow_failure();
}

}  // namespace ddp
