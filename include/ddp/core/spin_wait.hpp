#pragma once
// Waits briefly for a condition by yielding, before the caller falls back to blocking. A
// condition-variable wake-up costs tens of microseconds (more on a virtual machine, whose idle
// vCPU must be woken by the host), so a spin pays off when the event is near.
//
// How long to spin depends on who else wants the core. When every rank of the process has a
// core of its own, a waiting thread takes nothing from a computing peer, and the wake-up it
// avoids sits on the step's critical path: spin long (a collective waits for the slowest rank,
// often hundreds of microseconds). When ranks share cores, a spinning thread delays the very
// peer it waits for: spin briefly. And when the cores are busy (another process computes on
// them, whatever the affinity mask says), a spinning thread takes the core from whoever has work,
// and burns the scheduler's credit it would need to run at once when woken: it sleeps instead.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <thread>

#include "ddp/core/cpu_affinity.hpp"

namespace ddp::detail {

inline constexpr std::chrono::microseconds spin_budget{20};
inline constexpr std::chrono::microseconds dedicated_core_spin_budget{2000};
// A round of yields that takes longer than this gave the core to another thread: the core is busy.
// With no other thread wanting the core, sched_yield returns within a microsecond or two.
inline constexpr std::chrono::microseconds busy_core_round{50};
// After a busy round, how long every waiter of the process skips the yields and sleeps after its
// first pause rounds (the cores' load changes over milliseconds, not microseconds), unless a
// wait ends within its pause rounds first.
inline constexpr std::chrono::milliseconds busy_core_memory{20};

// When a waiter last found the cores busy (steady_clock ticks; process-wide), or not_seen: a wait
// that its peer ended within the pause rounds (the peer ran on a core of its own) clears it.
inline constexpr std::int64_t not_seen = std::numeric_limits<std::int64_t>::min() / 2;
inline std::atomic<std::int64_t>& busy_core_seen() {
  static std::atomic<std::int64_t> at{not_seen};
  return at;
}

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
  until,     // an event known to come soon (a failure being recorded): yield until it, busy cores or not
};

// Spins until ready() or the budget is spent; true when ready. The first rounds only pause the
// core (for_peer): a peer on a core of its own arrives within a few hundred nanoseconds, less than
// one sched_yield costs. The pause rounds are few because, when the scheduler has put the peer on
// this very core, each of them delays it. Later rounds yield, so that a thread waiting for this
// core gets it; a round of yields that gave the core away for long (busy_core_round) ends the
// spin, and for busy_core_memory after it (or until a wait ends within its pause rounds) no waiter
// for a peer in the process yields at all: the cores are busy, and sleeping serves the waiter and
// whoever has work better than spinning.
template <class Ready>
bool spin_until(Ready ready, std::chrono::microseconds budget = spin_budget, spin_kind kind = spin_kind::for_peer) {
  using clock = std::chrono::steady_clock;
  constexpr int pause_rounds = 32;  // about a microsecond, by the CPU's pause latency
  if (kind == spin_kind::for_peer)
    for (int i = 0; i < pause_rounds; ++i) {
      if (ready()) {
        // The peer ran on its own core meanwhile: the cores are not (or no longer) busy.
        auto& seen = busy_core_seen();
        if (seen.load(std::memory_order_relaxed) != not_seen) seen.store(not_seen, std::memory_order_relaxed);
        return true;
      }
      cpu_relax();
    }
  auto last = clock::now();
  // A waiter for a peer reads the cores' business from the yields; one waiting for its own core's
  // thread (for_core) expects a long yield: it ends its spin there, and tells nobody.
  const bool backs_off = kind != spin_kind::until, for_peer = kind == spin_kind::for_peer;
  if (for_peer && last.time_since_epoch().count() - busy_core_seen().load(std::memory_order_relaxed) <
      std::chrono::duration_cast<clock::duration>(busy_core_memory).count())
    return ready();
  const auto deadline = last + budget;
  for (;;) {
    for (int i = 0; i < 4; ++i) {
      if (ready()) return true;
      std::this_thread::yield();
    }
    const auto now = clock::now();
    if (backs_off && now - last > busy_core_round) {
      if (for_peer) busy_core_seen().store(now.time_since_epoch().count(), std::memory_order_relaxed);
      return ready();
    }
    if (now >= deadline) return ready();
    last = now;
  }
}

}  // namespace ddp::detail
