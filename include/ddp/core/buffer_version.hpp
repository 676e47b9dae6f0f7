#pragma once
// Version counter of a module buffer. It lets the trainer prove that a backward reads a buffer
// as its forward saw it (pitfall P1): the module bumps the version on every write and, when
// backward will read the buffer, saves the version in forward and releases it in backward.
// The trainer bumps it whenever buffer synchronisation overwrites the buffer, and checks the
// innermost saved version before each backward.
#include <cstdint>
#include <optional>
#include <vector>

namespace ddp {

class buffer_version {
 public:
  std::uint64_t value() const noexcept { return value_; }
  void bump() noexcept { ++value_; }

  // In forward: backward will read this buffer as it is now.
  void save_for_backward() { saved_.push_back(value_); }
  // In backward, after reading: pops the innermost save (backwards run innermost first).
  void release_saved() {
    if (!saved_.empty()) saved_.pop_back();
  }
  std::optional<std::uint64_t> innermost_saved() const {
    if (saved_.empty()) return std::nullopt;
    return saved_.back();
  }
  void clear_saved() noexcept { saved_.clear(); }

 private:
  std::uint64_t value_ = 0;
  std::vector<std::uint64_t> saved_;
};

}  // namespace ddp
