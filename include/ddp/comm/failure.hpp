#pragma once
// The failure state every communicator shares with its work handles and its watchdog: the first
// failure wins (which rank is at fault, what happened, whether it was a timeout), and every
// later collective on this rank throws it as ddp::peer_error or ddp::timeout_error.
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "ddp/core/error.hpp"

namespace ddp::comm {

struct failure {
  int origin = -1;     // the rank at fault (-1: unknown)
  std::string what;    // what happened, as every rank reports it
  bool timed_out = false;
  std::chrono::steady_clock::time_point at{};  // when it was recorded
};

class failure_latch {
 public:
  // Records `f` unless a failure is already recorded; true when this one was the first.
  bool set(failure f) {
    std::lock_guard lock(mutex_);
    if (failure_) return false;
    failure_ = std::move(f);
    failure_->at = std::chrono::steady_clock::now();
    failed_.store(true, std::memory_order_release);
    return true;
  }
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  std::optional<failure> get() const {
    std::lock_guard lock(mutex_);
    return failure_;
  }

  // Throws the recorded failure for `operation` on `rank` (nothing when there is none): a
  // timeout as ddp::timeout_error, anything else as ddp::peer_error "cannot complete <what>
  // because <failure>".
  void throw_if_failed(const char* backend, const std::string& operation, int rank,
                       const std::string& what_was_running) const {
    if (!failed()) return;
    std::lock_guard lock(mutex_);
    if (failure_->timed_out) throw timeout_error(backend, operation, rank, failure_->origin, failure_->what);
    throw peer_error(backend, operation, rank, failure_->origin,
                     "cannot complete " + what_was_running + " because " + failure_->what);
  }

 private:
  mutable std::mutex mutex_;
  std::optional<failure> failure_;
  std::atomic<bool> failed_{false};
};

}  // namespace ddp::comm
