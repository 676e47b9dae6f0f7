#pragma once
// Waits briefly for a condition by yielding, before the caller falls back to blocking. A
// condition-variable wake-up costs tens of microseconds (more on a virtual machine, whose idle
// vCPU must be woken by the host), so a spin pays off when the event is near.
//
// How long to spin depends on who else wants the core. When every rank of the process has a
// core of its own, a waiting thread takes nothing from a computing peer, and the wake-up it
// avoids sits on the step's critical path: spin long (a collective waits for the slowest rank,
// often hundreds of microseconds). When ranks share cores, a spinning thread delays the very
// peer it waits for: spin briefly.
#include <chrono>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

namespace ddp::detail {

inline constexpr std::chrono::microseconds spin_budget{20};
inline constexpr std::chrono::microseconds dedicated_core_spin_budget{2000};

// The cores this process may run on (its affinity mask: taskset, cpusets), else all of them.
inline int usable_cores() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
  return static_cast<int>(std::thread::hardware_concurrency());
}

// The budget for `ranks` in-process ranks: long when there are peers to wait for and a core
// for each rank.
inline std::chrono::microseconds spin_budget_for(int ranks) {
  return ranks >= 2 && ranks <= usable_cores() ? dedicated_core_spin_budget : spin_budget;
}

template <class Ready>
bool spin_until(Ready ready, std::chrono::microseconds budget = spin_budget) {
  const auto deadline = std::chrono::steady_clock::now() + budget;
  do {
    if (ready()) return true;
    std::this_thread::yield();
  } while (std::chrono::steady_clock::now() < deadline);
  return ready();
}

}  // namespace ddp::detail
