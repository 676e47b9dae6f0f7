#pragma once
// The CPUs this thread may run on (its affinity mask: taskset, cpusets, mpirun's binding), and
// binding a thread to one of them.
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

#include "ddp/core/error.hpp"

namespace ddp::detail {

// The CPUs in the calling thread's affinity mask, in order; empty where there is no mask.
inline std::vector<int> usable_cpus() {
  std::vector<int> cpus;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
#endif
  return cpus;
}

// How many cores the calling thread may run on, else all of the machine's.
inline int usable_cores() {
  const auto cpus = usable_cpus();
  return cpus.empty() ? static_cast<int>(std::thread::hardware_concurrency()) : static_cast<int>(cpus.size());
}

// Binds the calling thread, which runs rank `rank` of `backend`, to `cpu`; threads it starts
// afterwards inherit the binding.
inline void bind_this_thread(int cpu, const char* backend, int rank) {
  auto failed = [&](const std::string& why) {
    return error(backend, "bind", rank,
                 "cannot bind rank " + std::to_string(rank) + "'s thread to CPU " + std::to_string(cpu) + ": " + why);
  };
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0)
    throw failed(std::string(std::strerror(errno)) + "; allow that CPU (taskset, cpuset) or run without binding");
#else
  throw failed("binding threads needs Linux; run without binding");
#endif
}

}  // namespace ddp::detail
