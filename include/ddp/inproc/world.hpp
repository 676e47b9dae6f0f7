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
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>
#include <utility>

#include "ddp/comm/failure.hpp"
#include "ddp/comm/flight_recorder.hpp"
#include "ddp/comm/handoff.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/spin_wait.hpp"
#include "ddp/core/reduce_op.hpp"

namespace ddp::inproc {

struct options {
  // A collective that waits longer than this for a peer fails on every rank.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Bind rank r's thread, and so its progress thread and every thread it starts, to the r-th
  // CPU the launching thread may use (cycling when there are more ranks than CPUs), as mpirun
  // binds a process to a core. Off by default: the scheduler may then put two ranks' threads on
  // one core while another idles, which costs a small collective up to ten times its time.
  bool bind_to_cores = false;
  // The flight recorder of each rank's communicator (unset: DDP_FLIGHT_RECORDER_* or the defaults).
  std::optional<comm::recorder_options> recorder;
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
    return std::strcmp(a.name, b.name) == 0 && a.sequence == b.sequence && a.count == b.count &&
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
      : size_(size), options_(opts), slots_(size), arrived_at_(size), left_(size) {
    if (size < 1) throw error("inproc", "world", -1, "world size must be at least 1, got " +
                                                          std::to_string(size));
    if (size >= phase::max_ranks)
      throw error("inproc", "world", -1, "world size " + std::to_string(size) + " is over the in-process limit of " +
                                             std::to_string(phase::max_ranks - 1) + " ranks");
  }

  int size() const noexcept { return size_; }
  const options& settings() const noexcept { return options_; }
  // How long a thread of this world spins before it sleeps (core/spin_wait.hpp).
  std::chrono::microseconds spin_budget() const noexcept { return spin_; }
  slot& slot_of(int rank) noexcept { return slots_[rank]; }

  // Blocks until every rank arrived. Throws peer_error when a rank failed or left, and
  // timeout_error naming the missing ranks when the timeout passes.
  void arrive_and_wait(int rank, const collective_call& call) {
    throw_if_failed(rank, call);
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    std::uint64_t generation = 0;
    arrived_at_[rank].store(entry_.generation_of(entry_.state.load()) + 1, std::memory_order_relaxed);
    switch (entry_.arrive(generation)) {
      case phase::completed: return notify_sleepers();
      case phase::poisoned: return throw_failure(rank, call);
      case phase::waiting: break;
    }
    // A peer that already returned from its function will never arrive (leave() looks from the
    // other side: one of the two sees the other).
    for (int r = 0; r < size_; ++r)
      if (left_[r].load() && arrived_at_[r].load() != generation + 1) {
        set_failure(r, "rank " + std::to_string(r) + " already returned from its function and "
                       "will not join " + call.describe() + "; every rank must issue the same collectives");
        break;
      }
    auto passed = [&] { return entry_.generation_of(entry_.state.load()) != generation; };
    auto settled = [&] { return passed() || entry_.is_poisoned(entry_.state.load()) || failure_.failed(); };
    // Settles the phase against a failure: the ranks pass it together or fail it together.
    auto pass_or_throw = [&] {
      if (entry_.poison(generation)) return throw_failure(rank, call);
      if (!passed()) return throw_failure(rank, call);  // poisoned by a peer
    };
    if (detail::spin_until(settled, spin_)) {
      if (!passed()) pass_or_throw();
      return;
    }
    std::unique_lock lock(mutex_);
    ++sleepers_;
    struct leave_sleep {
      world& w;
      ~leave_sleep() { --w.sleepers_; }
    } asleep{*this};
    while (!settled()) {
      if (cv_.wait_until(lock, deadline) != std::cv_status::timeout || settled()) continue;
      std::string missing;
      int first_missing = -1;
      for (int r = 0; r < size_; ++r)
        if (arrived_at_[r].load() != generation + 1) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          if (first_missing < 0) first_missing = r;
        }
      // A rank records its arrival just before it counts itself in: when none is missing, the
      // last one is counting itself in right now.
      if (first_missing < 0) continue;
      if (!entry_.poison(generation)) break;  // the last rank arrived just now
      failure_.set({first_missing,
                    call.describe() + " timed out after " + std::to_string(options_.timeout.count()) +
                        " ms: rank(s) " + missing + " never arrived",
                    true});
      cv_.notify_all();
      lock.unlock();
      throw_failure(rank, call);
    }
    if (!passed()) {
      lock.unlock();
      pass_or_throw();
    }
  }

  // Called by every rank that passed arrive_and_wait for a collective, once its body finished
  // (also when the body threw); returns when every rank has called it. Ignores failures on
  // purpose: see the top of this file.
  void depart() {
    std::uint64_t generation = 0;
    if (exit_.arrive(generation) == phase::completed) return notify_sleepers();
    auto passed = [&] { return exit_.generation_of(exit_.state.load()) != generation; };
    if (detail::spin_until(passed, spin_)) return;
    std::unique_lock lock(mutex_);
    ++sleepers_;
    cv_.wait(lock, passed);
    --sleepers_;
  }

  // Marks the world failed because of `rank`; every pending and later collective throws.
  void fail(int rank, const std::string& what) {
    set_failure(rank, "rank " + std::to_string(rank) + " failed: " + what);
  }

  // `rank` will issue no more collectives; peers still waiting for it fail at once.
  void leave(int rank) {
    left_[rank].store(true);
    const auto s = entry_.state.load();
    if (entry_.count_of(s) > 0 && arrived_at_[rank].load() != entry_.generation_of(s) + 1)
      set_failure(rank, "rank " + std::to_string(rank) +
                            " returned from its function while other ranks wait for it in a "
                            "collective; every rank must issue the same collectives");
  }

  // The rank at fault and what happened, once the world failed (watchdogs of device
  // communicators bootstrapped from this world poll it).
  std::optional<std::pair<int, std::string>> failure_report() const {
    const auto f = failure_.get();
    if (!f) return std::nullopt;
    return std::pair{f->origin, f->what};
  }

  // When the world failed, once it did.
  std::optional<std::chrono::steady_clock::time_point> failed_at() const {
    const auto f = failure_.get();
    if (!f) return std::nullopt;
    return f->at;
  }

  // Elastic training's hand-over (launch_elastic sets it; null otherwise).
  void set_handoff(elastic::handoff* h) noexcept { handoff_ = h; }
  elastic::handoff* handoff() const noexcept { return handoff_; }

  std::optional<int> failed_rank() const {
    const auto f = failure_.get();
    if (!f) return std::nullopt;
    return f->origin;
  }

 private:
  // A barrier without a lock: one word holds the generation, the number of ranks that arrived in
  // it, and a poison bit. The last arrival advances the generation; a waiter that gives up (a
  // failure, a timeout) poisons the generation instead, and every change is a compare-exchange
  // on the word, so exactly one of the two happens: the ranks pass a generation together or fail
  // it together.
  struct phase {
    static constexpr int count_bits = 20;
    static constexpr int max_ranks = 1 << count_bits;
    static constexpr std::uint64_t count_mask = (std::uint64_t{1} << count_bits) - 1;
    static constexpr std::uint64_t poison_bit = std::uint64_t{1} << 63;
    enum outcome { completed, waiting, poisoned };

    std::atomic<std::uint64_t> state{0};
    int size = 1;

    static std::uint64_t generation_of(std::uint64_t s) { return (s & ~poison_bit) >> count_bits; }
    static std::uint64_t count_of(std::uint64_t s) { return s & count_mask; }
    static bool is_poisoned(std::uint64_t s) { return (s & poison_bit) != 0; }

    outcome arrive(std::uint64_t& generation) {
      auto s = state.load(std::memory_order_acquire);
      for (;;) {
        if (is_poisoned(s)) return poisoned;
        generation = generation_of(s);
        const bool last = count_of(s) + 1 == static_cast<std::uint64_t>(size);
        const auto next = last ? (generation + 1) << count_bits : s + 1;
        if (state.compare_exchange_weak(s, next)) return last ? completed : waiting;
      }
    }
    // True when this call poisoned `generation`, or it already was; false when it completed.
    bool poison(std::uint64_t generation) {
      auto s = state.load(std::memory_order_acquire);
      for (;;) {
        if (generation_of(s) != generation) return false;
        if (is_poisoned(s)) return true;
        if (state.compare_exchange_weak(s, s | poison_bit, std::memory_order_acq_rel)) return true;
      }
    }
  };

  // Wakes ranks asleep in a barrier; free when none sleeps. A sleeper counts itself (under the
  // mutex) before it looks at the barrier's word, and the waker looks at the count after it
  // changed the word: one of the two sees the other.
  void notify_sleepers() {
    if (sleepers_.load() == 0) return;
    std::lock_guard lock(mutex_);
    cv_.notify_all();
  }

  void set_failure(int origin, std::string what) {
    failure_.set({origin, std::move(what), false});
    std::lock_guard lock(mutex_);
    cv_.notify_all();
  }

  void throw_if_failed(int rank, const collective_call& call) const {
    if (failure_.failed()) failure_.throw_if_failed("inproc", call.name, rank, call.describe());
  }

  // The barrier was poisoned: its poisoner records the failure just before or just after.
  [[noreturn]] void throw_failure(int rank, const collective_call& call) const {
    detail::spin_until([&] { return failure_.failed(); }, std::chrono::seconds(1), detail::spin_kind::until);
    throw_if_failed(rank, call);
    throw error("inproc", call.name, rank, call.describe() + " failed on a peer that recorded no reason");
  }

  const int size_;
  const options options_;
  const std::chrono::microseconds spin_ = detail::spin_budget_for(size_);
  std::vector<slot> slots_;

  std::mutex mutex_;  // for sleeping only
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
  phase entry_{.state{0}, .size = size_};  // arrive_and_wait
  phase exit_{.state{0}, .size = size_};   // depart
  std::vector<std::atomic<std::uint64_t>> arrived_at_;  // entry generation + 1 a rank last arrived at
  std::vector<std::atomic<bool>> left_;
  comm::failure_latch failure_;
  elastic::handoff* handoff_ = nullptr;
};

}  // namespace ddp::inproc
