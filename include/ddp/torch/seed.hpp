#pragma once
// Building a net from a seed when ranks are threads of one process: torch::manual_seed seeds one
// global generator, so nets built at the same time on several threads would draw each other's
// numbers. build_seeded builds them one at a time, each from its own seed alone.
//
//   auto net = ddp::torch::build_seeded(seed, [] { return MyNet(); });
#include <torch/torch.h>

#include <cstdint>
#include <mutex>
#include <utility>

namespace ddp::torch {

namespace detail {
inline std::mutex& global_generator_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace detail

template <class Build>
auto build_seeded(std::uint64_t seed, Build&& build) {
  std::lock_guard lock(detail::global_generator_mutex());
  ::torch::manual_seed(seed);
  return std::forward<Build>(build)();
}

}  // namespace ddp::torch
