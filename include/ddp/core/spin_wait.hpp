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

#include "ddp/core/cpu_affinity.hpp"

namespace ddp::detail {

inline constexpr std::chrono::microseconds spin_budget{20};
inline constexpr std::chrono::microseconds dedicated_core_spin_budget{2000};

// The budget for `ranks` in-process ranks: long when there are peers to wait for and a core
// for each rank.
inline std::chrono::microseconds spin_budget_for(int ranks) {
  return ranks >= 2 && ranks <= usable_cores() ? dedicated_core_spin_budget : spin_budget;
}

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

enum class spin_kind {
  for_peer,  // a thread on another core will make `ready` true: pause first, then yield
  for_core,  // the thread that makes it true may need this core: only yield
};

// Spins until ready() or the budget is spent; true when ready. The first rounds only pause the
// core (for_peer): a peer on a core of its own arrives within a few hundred nanoseconds, less than
// one sched_yield costs. The pause rounds are few because, when the scheduler has put the peer on
// this very core, each of them delays it. Later rounds yield, so that a thread waiting for this
// core gets it.
template <class Ready>
bool spin_until(Ready ready, std::chrono::microseconds budget = spin_budget, spin_kind kind = spin_kind::for_peer) {
  constexpr int pause_rounds = 32;  // about a microsecond, by the CPU's pause latency
  if (kind == spin_kind::for_peer)
    for (int i = 0; i < pause_rounds; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
  const auto deadline = std::chrono::steady_clock::now() + budget;
  do {
    for (int i = 0; i < 4; ++i) {
      if (ready()) return true;
      std::this_thread::yield();
    }
  } while (std::chrono::steady_clock::now() < deadline);
  return ready();
}

}  // namespace ddp::detail
