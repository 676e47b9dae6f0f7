#pragma once
// Runs fn(comm) on `world` in-process ranks and keeps what each rank threw, for tests of errors
// that must reach every rank.
#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include "ddp/inproc/launch.hpp"

namespace test {

struct ranks_outcome {
  std::vector<std::string> errors;  // by rank; empty for a rank that returned normally
  double seconds = 0;
  bool all_threw() const {
    for (const auto& e : errors)
      if (e.empty()) return false;
    return true;
  }
};

template <class F>
ranks_outcome on_ranks(int world, F fn) {
  ranks_outcome o;
  o.errors.resize(static_cast<std::size_t>(world));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
      try {
        fn(comm);
      } catch (const std::exception& e) {
        o.errors[static_cast<std::size_t>(comm.rank())] = e.what();
        throw;
      }
    });
  } catch (const std::exception&) {
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return o;
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// An error's first line: what is wrong (the fix may follow on it, or on the lines after).
inline std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace test
