// The conformance suite on in-process ranks, for every world size the contract names.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "../conformance/communicator_suite.hpp"
#include "ddp/comm/collectives.hpp"
#include "ddp/inproc/launch.hpp"

namespace inproc_communicator_test {

namespace {
const int world_sizes[] = {1, 2, 3, 4, 8};
}

TEST_CASE("inproc all_reduce: every dtype, op, size, in and out of place") {
  for (int w : world_sizes) {
    CAPTURE(w);
    ddp::inproc::launch(w, [](auto& comm) { conformance::all_reduce_cases(comm); });
  }
}

TEST_CASE("inproc broadcast: every dtype, size and root") {
  for (int w : world_sizes)
    ddp::inproc::launch(w, [](auto& comm) { conformance::broadcast_cases(comm); });
}

TEST_CASE("inproc all_gather: every dtype and size, in and out of place") {
  for (int w : world_sizes)
    ddp::inproc::launch(w, [](auto& comm) { conformance::all_gather_cases(comm); });
}

TEST_CASE("inproc reduce_scatter: every dtype, op and size, in and out of place") {
  for (int w : world_sizes)
    ddp::inproc::launch(w, [](auto& comm) { conformance::reduce_scatter_cases(comm); });
}

TEST_CASE("inproc f16 and bf16: all_reduce and reduce_scatter in f32 arithmetic, rounded once, and moved as bytes") {
  for (int w : world_sizes)
    ddp::inproc::launch(w, [](auto& comm) { conformance::half_cases(comm); });
}

TEST_CASE("inproc asynchronous collectives complete in issue order") {
  for (int w : world_sizes)
    ddp::inproc::launch(w, [](auto& comm) { conformance::async_cases(comm); });
}

TEST_CASE("inproc all_reduce is bitwise identical on every rank and in every run") {
  for (int w : {2, 3, 8}) {
    auto first = ddp::inproc::launch(w, [](auto& comm) { return conformance::determinism_case(comm); });
    auto second = ddp::inproc::launch(w, [](auto& comm) { return conformance::determinism_case(comm); });
    CHECK(first == second);
  }
}

TEST_CASE("inproc waiting threads spin long only when every rank has a core of its own") {
  using ddp::detail::spin_budget_for;
  const int cores = ddp::detail::usable_cores();
  CHECK(cores >= 1);
  CHECK(cores <= static_cast<int>(std::thread::hardware_concurrency()));
  CHECK(spin_budget_for(1) == ddp::detail::spin_budget);          // no peer to wait for
  CHECK(spin_budget_for(cores + 1) == ddp::detail::spin_budget);  // ranks share cores
  if (cores >= 2) CHECK(spin_budget_for(2) == ddp::detail::dedicated_core_spin_budget);
  CHECK(ddp::detail::dedicated_core_spin_budget > ddp::detail::spin_budget);
}

TEST_CASE("inproc bind_to_cores puts each rank, and the threads it starts, on a CPU of its own") {
  const auto cpus = ddp::detail::usable_cpus();
  REQUIRE(!cpus.empty());
  // Up to 5 ranks: where there are fewer CPUs, ranks cycle over them.
  const int world = static_cast<int>(std::min<std::size_t>(cpus.size() + 1, 5));
  ddp::inproc::options opts;
  opts.bind_to_cores = true;
  auto placed = ddp::inproc::launch(
      world,
      [](ddp::inproc::communicator& comm) {
        std::vector<int> started;
        std::thread([&] { started = ddp::detail::usable_cpus(); }).join();
        std::vector<float> v(100, static_cast<float>(comm.rank() + 1));
        ddp::comm::all_reduce(comm, std::span<float>(v), ddp::reduce_op::sum);
        CHECK(v.front() == static_cast<float>(comm.size() * (comm.size() + 1) / 2));
        CHECK(started == ddp::detail::usable_cpus());
        return ddp::detail::usable_cpus();
      },
      opts);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    REQUIRE(placed[r].size() == 1);
    CHECK(placed[r].front() == cpus[static_cast<std::size_t>(r) % cpus.size()]);
  }
  // Without the option the ranks keep the launching thread's CPUs.
  auto unbound = ddp::inproc::launch(2, [](ddp::inproc::communicator&) { return ddp::detail::usable_cpus(); });
  CHECK(unbound[0] == cpus);
}

TEST_CASE("inproc avg: ranks at the largest power of two average to it, not inf (the sum would overflow)") {
  for (int w : {2, 3, 4}) ddp::inproc::launch(w, [](auto& comm) { conformance::avg_overflow_cases(comm); });
}

}  // namespace inproc_communicator_test
