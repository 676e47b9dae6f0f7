#pragma once
// Waits briefly for a condition by yielding, before the caller falls back to blocking. A
// condition-variable wake-up costs tens of microseconds, so a short spin pays off when the
// event is imminent; bounded in time, because ranks often compute for milliseconds on the
// same cores that a longer spin would take from them.
#include <chrono>
#include <thread>

namespace ddp::detail {

inline constexpr std::chrono::microseconds spin_budget{20};

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
