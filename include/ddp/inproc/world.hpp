#pragma once
// The rendezvous shared by the in-process ranks: a slot per rank where each publishes its
// buffers for the current collective, and two barriers around the collective's body.
//   arrive_and_wait (before the body) never hangs: it fails every waiting and later rank when
//     one rank failed, left, or did not arrive within the timeout. It is all or nothing: either
//     every rank passes it for a collective, or none does.
//   depart (after the body) waits for every rank, failed or not: the bodies read and write the
//     peers' buffers and slots, so no rank may return (and free or reuse them) before every
//     peer is done with them. Bodies never wait, so departure always completes.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>
#include <utility>

#include "ddp/comm/failure.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/spin_wait.hpp"
#include "ddp/core/reduce_op.hpp"

namespace ddp::inproc {

struct options {
  // A collective that waits longer than this for a peer fails on every rank.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

// What one rank asks of the current collective; every rank must ask the same.
struct collective_call {
  const char* name = "";
  std::uint64_t sequence = 0;
  std::size_t count = 0;
  ddp::dtype type = ddp::dtype::f32;
  reduce_op op = reduce_op::sum;
  int root = 0;

  friend bool operator==(const collective_call& a, const collective_call& b) {
    return std::string(a.name) == b.name && a.sequence == b.sequence && a.count == b.count &&
           a.type == b.type && a.op == b.op && a.root == b.root;
  }
  std::string describe() const {
    return std::string(name) + " #" + std::to_string(sequence) + " (count " +
           std::to_string(count) + ", " + std::string(name_of(type)) + ", " +
           std::string(name_of(op)) + ", root " + std::to_string(root) + ")";
  }
};

struct slot {
  collective_call call;
  const void* send = nullptr;
  void* recv = nullptr;
};

class world {
 public:
  explicit world(int size, options opts = {})
      : size_(size), options_(opts), slots_(size), arrived_at_(size, 0), left_(size, false) {
    if (size < 1) throw error("inproc", "world", -1, "world size must be at least 1, got " +
                                                          std::to_string(size));
  }

  int size() const noexcept { return size_; }
  const options& settings() const noexcept { return options_; }
  // How long a thread of this world spins before it sleeps (core/spin_wait.hpp).
  std::chrono::microseconds spin_budget() const noexcept { return spin_; }
  slot& slot_of(int rank) noexcept { return slots_[rank]; }

  // Blocks until every rank arrived. Throws peer_error when a rank failed or left, and
  // timeout_error naming the missing ranks when the timeout passes.
  void arrive_and_wait(int rank, const collective_call& call) {
    std::unique_lock lock(mutex_);
    throw_if_failed(rank, call);
    for (int r = 0; r < size_; ++r)
      if (left_[r]) {
        set_failure(r, "rank " + std::to_string(r) + " already returned from its function and "
                       "will not join " + call.describe() +
                       "; every rank must issue the same collectives");
        throw_if_failed(rank, call);
      }
    const std::uint64_t generation = entry_.generation;
    arrived_at_[rank] = generation + 1;
    if (arrive(entry_, lock)) return;
    lock.lock();
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    while (entry_.generation == generation) {
      throw_if_failed(rank, call);
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && entry_.generation == generation &&
          !failure_.failed()) {
        std::string missing;
        int first_missing = -1;
        for (int r = 0; r < size_; ++r)
          if (arrived_at_[r] != generation + 1) {
            missing += (missing.empty() ? "" : ", ") + std::to_string(r);
            if (first_missing < 0) first_missing = r;
          }
        failure_.set({first_missing,
                      call.describe() + " timed out after " + std::to_string(options_.timeout.count()) +
                          " ms: rank(s) " + missing + " never arrived",
                      true});
        cv_.notify_all();
      }
    }
  }

  // Called by every rank that passed arrive_and_wait for a collective, once its body finished
  // (also when the body threw); returns when every rank has called it. Ignores failures on
  // purpose: see the top of this file.
  void depart() {
    std::unique_lock lock(mutex_);
    const std::uint64_t generation = exit_.generation;
    if (arrive(exit_, lock)) return;
    lock.lock();
    cv_.wait(lock, [&] { return exit_.generation != generation; });
  }

  // Marks the world failed because of `rank`; every pending and later collective throws.
  void fail(int rank, const std::string& what) {
    {
      std::lock_guard lock(mutex_);
      set_failure(rank, "rank " + std::to_string(rank) + " failed: " + what);
    }
    cv_.notify_all();
  }

  // `rank` will issue no more collectives; peers still waiting for it fail at once.
  void leave(int rank) {
    {
      std::lock_guard lock(mutex_);
      left_[rank] = true;
      if (entry_.arrived > 0 && arrived_at_[rank] != entry_.generation + 1)
        set_failure(rank, "rank " + std::to_string(rank) +
                              " returned from its function while other ranks wait for it in a "
                              "collective; every rank must issue the same collectives");
    }
    cv_.notify_all();
  }

  // The rank at fault and what happened, once the world failed (watchdogs of device
  // communicators bootstrapped from this world poll it).
  std::optional<std::pair<int, std::string>> failure_report() const {
    const auto f = failure_.get();
    if (!f) return std::nullopt;
    return std::pair{f->origin, f->what};
  }

  std::optional<int> failed_rank() const {
    const auto f = failure_.get();
    if (!f) return std::nullopt;
    return f->origin;
  }

 private:
  // One barrier's count; its generation advances when the last of size_ ranks arrives.
  struct phase {
    int arrived = 0;
    std::uint64_t generation = 0;
    std::atomic<std::uint64_t> released{0};  // generation, readable without the lock
  };

  // Caller holds `lock`, which is released on return. True when this arrival completed the phase
  // (the others are woken) or the phase completed while spinning; false when the caller must
  // block on cv_ (with the lock taken again) until the generation moves.
  bool arrive(phase& p, std::unique_lock<std::mutex>& lock) {
    const std::uint64_t generation = p.generation;
    if (++p.arrived == size_) {
      p.arrived = 0;
      ++p.generation;
      p.released.store(p.generation, std::memory_order_release);
      lock.unlock();
      cv_.notify_all();
      return true;
    }
    lock.unlock();
    return detail::spin_until([&] { return p.released.load(std::memory_order_acquire) != generation; }, spin_);
  }

  // Caller holds mutex_ (the barrier reads the failure and its own state together).
  void set_failure(int origin, std::string what) { failure_.set({origin, std::move(what), false}); }

  void throw_if_failed(int rank, const collective_call& call) const {
    failure_.throw_if_failed("inproc", call.name, rank, call.describe());
  }

  const int size_;
  const options options_;
  const std::chrono::microseconds spin_ = detail::spin_budget_for(size_);
  std::vector<slot> slots_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  phase entry_;                            // arrive_and_wait
  phase exit_;                             // depart
  std::vector<std::uint64_t> arrived_at_;  // entry generation + 1 a rank last arrived at
  std::vector<bool> left_;
  comm::failure_latch failure_;
};

}  // namespace ddp::inproc
