#pragma once
#include <concepts>

namespace ddp {

// The handle an asynchronous collective returns.
//   wait(): returns once the collective's result may be used by work the caller issues next
//           (host backends: the data is in place; stream backends: the caller's compute
//           queue is ordered after the collective). Rethrows the collective's failure.
//   test(): true once wait() would return without blocking; never throws.
template <class W>
concept work_handle = std::movable<W> && requires(W& w) {
  w.wait();
  { w.test() } -> std::same_as<bool>;
};

}  // namespace ddp
