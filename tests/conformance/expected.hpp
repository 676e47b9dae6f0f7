#pragma once
// The inputs every rank contributes in a collective's check, and the exact result they must
// give: the conformance suite's (communicator_suite.hpp) and ddp-bench collective's -c check.
#include <cstddef>

#include "ddp/core/reduce_op.hpp"

namespace conformance {

// Integer-valued inputs keep sums exact in every dtype, so the expected result is exact.
template <class T>
T input(int rank, std::size_t i) {
  return static_cast<T>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3) % 11) + 1);
}

template <class T>
T expected_reduction(int world, std::size_t i, ddp::reduce_op op) {
  T acc = input<T>(0, i);
  for (int r = 1; r < world; ++r) {
    const T x = input<T>(r, i);
    switch (op) {
      case ddp::reduce_op::sum: case ddp::reduce_op::avg: acc = static_cast<T>(acc + x); break;
      case ddp::reduce_op::min: acc = x < acc ? x : acc; break;
      case ddp::reduce_op::max: acc = x > acc ? x : acc; break;
    }
  }
  if (op == ddp::reduce_op::avg) acc = static_cast<T>(acc / static_cast<T>(world));
  return acc;
}

}  // namespace conformance
