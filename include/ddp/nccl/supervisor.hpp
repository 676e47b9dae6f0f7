#pragma once
// What the NCCL communicator does about time and failure, apart from NCCL and CUDA so that a host
// test drives it with a fake (tests/nccl/supervisor_test.cpp): NCCL's start-up and its bound, a
// call that NCCL is still queueing (ncclInProgress), the watchdog's look at the collectives in
// flight, the first failure and the abort it brings, and the teardown. Needs neither <nccl.h>
// nor the CUDA headers.
//
// A non-blocking NCCL communicator (the only kind ddp makes) does two things in the background
// that need every peer: its start-up (ncclCommInitRankConfig) and, at a collective that first
// uses a connection, connecting to the peers; meanwhile the call returns ncclInProgress and
// ncclCommGetAsyncError says so until it is done. Both are bounded here: start-up by
// options::init_timeout, a collective (queueing included) by options::timeout; and neither
// holds the lock the watchdog needs to abort NCCL while it waits.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "ddp/comm/failure.hpp"
#include "ddp/comm/flight_recorder.hpp"
#include "ddp/comm/watchdog.hpp"
#include "ddp/core/error.hpp"

namespace ddp::nccl {

struct options {
  // A collective fails on every rank when it runs longer than this on the GPU (counted from when
  // its stream reaches it, not from when the host queued it), or when NCCL is still queueing it
  // this long after the call (connecting to peers that never join it).
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // How long creating the communicator may take (ncclCommInitRankConfig, which needs every rank):
  // tens to hundreds of ms on one machine, seconds or more across many nodes. Distinct from
  // `timeout`, so a short collective timeout does not fail a healthy start-up.
  std::chrono::milliseconds init_timeout{std::chrono::minutes(10)};
  // How long the destructor waits for queued collectives to finish before it aborts NCCL.
  std::chrono::milliseconds teardown{std::chrono::seconds(30)};
  // What a failure does to NCCL: abort it (ncclCommAbort), or revoke it (ncclCommRevoke: the
  // collectives in flight stop, and the communicator stays, so that the ranks that remain can
  // shrink it into a smaller one: communicator::shrink).
  enum class on_failure { abort, revoke } failure_action = on_failure::abort;
  // The flight recorder (comm/flight_recorder.hpp; unset: DDP_FLIGHT_RECORDER_* or the defaults).
  std::optional<comm::recorder_options> recorder;
};

// How ranks tell each other that one gave up, beside NCCL: `abort` tells every peer (or ends
// the job), `poll` returns a peer's failure (rank, what) once there is one.
struct peer_channel {
  std::function<void(const std::string&)> abort = [](const std::string&) {};
  std::function<std::optional<std::pair<int, std::string>>()> poll = [] {
    return std::optional<std::pair<int, std::string>>{};
  };
};

namespace detail {

using clock = std::chrono::steady_clock;
using comm::failure;

// What NCCL says of a call on a non-blocking communicator: done, still in the background
// (ncclInProgress), or failed (`what`: NCCL's description, made while the handle still lived).
enum class call_state { done, in_progress, failed };
struct call_result {
  call_state state = call_state::done;
  std::string what;
};

// Between polls of a call NCCL is finishing: yield at first (most finish within microseconds),
// then sleep, so a long connection set-up neither burns a core nor keeps the lock's waiters out.
inline void pause_between_polls(unsigned i) {
  if (i < 64) std::this_thread::yield();
  else std::this_thread::sleep_for(std::chrono::microseconds(i < 1024 ? 20 : 200));
}

// Handle (one NCCL communicator; the supervisor calls it only under its lock):
//   bool live() const        not created yet, or aborted / destroyed: false
//   call_result poll(const char* operation)   ncclCommGetAsyncError; `operation` names the call
//                            for the description (nullptr: the watchdog's look)
//   void abort() noexcept    ncclCommAbort; afterwards live() is false (harmless when not live)
//   bool revoke() noexcept   ncclCommRevoke: in-flight calls stop; live() stays true, and poll()
//                            says in_progress until the communicator is quiescent; false when
//                            NCCL refused (the supervisor aborts it then)
//   call_result finalize()   ncclCommFinalize
//   void destroy() noexcept  ncclCommDestroy; afterwards live() is false
// Entry (one collective; `name`, `sequence` set before the supervisor sees it; `sequence` is its
// id in the flight recorder given to the supervisor, if any, which it marks started and completed):
//   const char* name; std::uint64_t sequence;
//   std::optional<clock::time_point> seen_started; bool settling;   (the supervisor's, under its lock)
//   bool reached() const     its stream reached it (the work before it has finished)
//   bool finished() const    it finished on the GPU; both may throw a device error
template <class Handle, class Entry>
class supervisor {
 public:
  // `where` names the device in messages ("cuda:0").
  supervisor(int rank, std::string where, options opts, peer_channel channel, Handle handle = {},
             comm::flight_recorder* recorder = nullptr)
      : rank_(rank),
        where_(std::move(where)),
        options_(opts),
        channel_(std::move(channel)),
        handle_(std::move(handle)),
        recorder_(recorder) {}
  supervisor(const supervisor&) = delete;
  supervisor& operator=(const supervisor&) = delete;
  ~supervisor() { close(); }

  // Creates the communicator: `init(handle)` starts NCCL's start-up (ncclCommInitRankConfig),
  // then this waits for it, at most options.init_timeout. On NCCL's error, a peer's failure or
  // the bound it aborts the handle, tells the peers and throws, naming the rank, the device and
  // the option to raise.
  template <class Init>
  void start(Init init) {
    call_result r;
    {
      std::lock_guard lock(mutex_);
      r = init(handle_);
    }
    const auto deadline = clock::now() + options_.init_timeout;
    for (unsigned i = 0;; ++i) {
      if (r.state == call_state::done) return;
      std::string why;
      if (r.state == call_state::failed) {
        why = r.what;
      } else if (auto peer = channel_.poll()) {
        why = "rank " + std::to_string(peer->first) + " gave up: " + peer->second;
      } else if (clock::now() > deadline) {
        why = "it did not finish within " + std::to_string(options_.init_timeout.count()) +
              " ms (ddp::nccl::options::init_timeout): a rank never created its communicator (every rank must "
              "call ddp::nccl::bootstrap), or start-up takes longer here (many ranks or nodes): raise "
              "options.init_timeout";
      }
      if (!why.empty()) {
        {
          std::lock_guard lock(mutex_);
          handle_.abort();  // releases what start-up made; the handle is unusable after a failure
        }
        const std::string what = "setting up the NCCL communicator on rank " + std::to_string(rank_) + " (" +
                                 where_ + ") failed: " + why;
        channel_.abort(what);
        throw error("nccl", "ncclCommInitRankConfig", rank_, what);
      }
      pause_between_polls(i);
      std::lock_guard lock(mutex_);
      r = handle_.poll("ncclCommInitRankConfig");
    }
  }

  // Starts the watchdog thread (`on_start` runs first on it): every poll it looks at the
  // collectives in flight, NCCL's asynchronous error and the peers.
  void start_watching(std::function<void()> on_start = {}) {
    const auto poll = std::clamp<std::chrono::milliseconds>(options_.timeout / 10, std::chrono::milliseconds(1),
                                                           std::chrono::milliseconds(100));
    watchdog_.emplace(poll, [this] { return look(); }, std::move(on_start));
  }

  // Queues one collective: `call(handle)` makes the NCCL call. When NCCL is still queueing it
  // (ncclInProgress: it connects to the peers, which needs them), the collective is in flight
  // already, settling, under the watchdog: past options.timeout it fails every rank, naming the
  // collective, and so does a peer's failure or an abort; the poll here holds the lock only for
  // each ncclCommGetAsyncError, so the watchdog can abort NCCL meanwhile. Once NCCL has queued
  // it, `queued()` runs (records its completion event) and says whether the watchdog watches it
  // further (false: captured into a CUDA graph). Throws the failure, if any.
  template <class Call, class Queued>
  void submit(const std::shared_ptr<Entry>& e, Call call, Queued queued) {
    call_result r;
    {
      std::lock_guard lock(mutex_);
      if (!handle_.live() || revoked_) throw_failed(e->name);
      r = call(handle_);
    }
    bool settling = false;
    if (r.state == call_state::in_progress) {
      {
        std::lock_guard lock(watch_mutex_);
        e->settling = true;
        e->seen_started = clock::now();  // its clock runs from the call until NCCL has queued it
        in_flight_.push_back(e);
      }
      settling = true;
      r = settle(e->name);
    }
    if (r.state == call_state::done) {
      bool watch = false;
      try {
        watch = queued();
      } catch (...) {
        if (settling) forget(e);
        throw;
      }
      std::lock_guard lock(watch_mutex_);
      if (settling) {
        e->settling = false;
        e->seen_started.reset();  // now the GPU's clock: from when its stream reaches it
        if (!watch) erase(e);
      } else if (watch) {
        in_flight_.push_back(e);
      }
      return;
    }
    if (settling) forget(e);
    if (r.state == call_state::failed) {
      const std::string what = std::string(e->name) + " failed on rank " + std::to_string(rank_) + ": " + r.what;
      if (fail({rank_, what, false})) channel_.abort(what);
      throw error("nccl", e->name, rank_, what);
    }
    throw_failed(e->name);  // aborted while NCCL queued it: the watchdog's timeout, a peer, abort()
  }

  // Puts work already queued (a CUDA graph's launch) under the watchdog.
  void track(std::shared_ptr<Entry> e) {
    std::lock_guard lock(watch_mutex_);
    in_flight_.push_back(std::move(e));
  }

  // Once the communicator is quiescent (a revoked one: when NCCL says its collectives have
  // stopped, or reports its error; at most options.init_timeout), `use(handle, errored)` under
  // the lock, `errored` when NCCL reported an error: the ranks that remain shrink it into a new
  // one. Throws when it was aborted, or does not become quiescent in time.
  template <class Use>
  call_result when_quiescent(const char* operation, Use use) {
    const auto deadline = clock::now() + options_.init_timeout;
    for (unsigned i = 0;; ++i) {
      {
        std::lock_guard lock(mutex_);
        if (!handle_.live())
          throw error("nccl", operation, rank_,
                      "the NCCL communicator on rank " + std::to_string(rank_) + " (" + where_ +
                          ") was aborted, not revoked: only a communicator created with options.failure_action = "
                          "on_failure::revoke can be shrunk after a failure");
        // A revoked communicator reports its own revocation until quiescent; any state will do
        // for a healthy one.
        const call_result r = revoked_ ? handle_.poll(operation) : call_result{};
        if (r.state != call_state::in_progress) return use(handle_, r.state == call_state::failed);
      }
      if (clock::now() > deadline)
        throw error("nccl", operation, rank_,
                    "the revoked NCCL communicator on rank " + std::to_string(rank_) + " (" + where_ +
                        ") did not become quiescent within " + std::to_string(options_.init_timeout.count()) +
                        " ms (ddp::nccl::options::init_timeout)");
      pause_between_polls(i);
    }
  }

  bool failed() const noexcept { return latch_.failed(); }
  const options& settings() const noexcept { return options_; }
  void throw_if_failed(const char* operation) const { latch_.throw_if_failed("nccl", operation, rank_, operation); }

  // Records the first failure and aborts (or revokes) NCCL so kernels waiting for a peer exit;
  // tells the peers when `tell_peers`. True when this was the first failure.
  bool fail(failure f, bool tell_peers = false) {
    bool first = false;
    const std::string what = recorder_ ? f.what : std::string();
    {
      std::lock_guard lock(mutex_);
      first = latch_.set(std::move(f));
      if (first && options_.failure_action == options::on_failure::revoke && handle_.live() && handle_.revoke())
        revoked_ = true;
      else if (first)
        handle_.abort();
    }
    if (first && recorder_) recorder_->dump_once(what);
    if (first && tell_peers) channel_.abort(latch_.get()->what);
    return first;
  }

  // Stops the watchdog, then finishes what is queued and takes the communicator down; aborts if
  // that cannot finish: a peer that gave up will never finish its part, so it stops waiting
  // then, and after min(options.teardown, options.timeout) at most. Idempotent.
  void close() noexcept {
    watchdog_.reset();
    std::lock_guard lock(mutex_);
    if (!handle_.live()) return;
    if (latch_.failed()) return handle_.abort();
    call_result r = handle_.finalize();
    const auto deadline = clock::now() + std::min(options_.teardown, options_.timeout);
    for (unsigned i = 0; r.state != call_state::failed; ++i) {
      r = handle_.poll(nullptr);
      if (r.state != call_state::in_progress) break;
      bool peer_gave_up = true;
      try {
        peer_gave_up = channel_.poll().has_value();
      } catch (...) {
      }
      if (clock::now() > deadline || peer_gave_up) break;
      std::this_thread::sleep_for(std::chrono::microseconds(i < 100 ? 10 : 100));
    }
    if (r.state == call_state::done) handle_.destroy();
    else handle_.abort();
  }

 private:
  // Polls until NCCL has queued the call (done or failed); in_progress when a failure was
  // latched meanwhile (the handle is aborted then).
  call_result settle(const char* name) {
    for (unsigned i = 0;; ++i) {
      pause_between_polls(i);  // the lock is free here: the watchdog may abort
      std::lock_guard lock(mutex_);
      if (latch_.failed() || !handle_.live()) return {call_state::in_progress, {}};
      call_result r = handle_.poll(name);
      if (r.state != call_state::in_progress) return r;
    }
  }

  [[noreturn]] void throw_failed(const char* operation) const {
    throw_if_failed(operation);
    throw error("nccl", operation, rank_, "the NCCL communicator on rank " + std::to_string(rank_) + " is not usable");
  }

  void erase(const std::shared_ptr<Entry>& e) {  // caller holds watch_mutex_
    if (auto it = std::find(in_flight_.begin(), in_flight_.end(), e); it != in_flight_.end()) in_flight_.erase(it);
  }
  void forget(const std::shared_ptr<Entry>& e) {
    std::lock_guard lock(watch_mutex_);
    erase(e);
  }

  std::string describe_timeout(const Entry& e) const {
    return std::string(e.name) + " #" + std::to_string(e.sequence) + " on rank " + std::to_string(rank_) +
           " made no progress for " + std::to_string(options_.timeout.count()) +
           " ms: a peer never joined it, or died" +
           (e.settling ? " (NCCL had not queued it yet: it was still connecting to the peers)" : "");
  }

  // The watchdog's look: a finished collective leaves the in-flight list; the oldest one past
  // the timeout (on the GPU's clock), the one NCCL is still queueing past the timeout (on the
  // host's), a GPU or NCCL error, or a peer's failure fails every rank. False once failed.
  bool look() {
    if (latch_.failed()) return false;
    std::optional<failure> found;
    bool tell = true;
    {
      std::lock_guard lock(watch_mutex_);
      try {
        while (!in_flight_.empty() && !in_flight_.front()->settling && in_flight_.front()->finished()) {
          if (recorder_) recorder_->completed(in_flight_.front()->sequence);
          in_flight_.pop_front();
        }
      } catch (const std::exception& e) {  // a device error: nothing on this GPU completes any more
        found = failure{rank_, std::string("the GPU reported an error: ") + e.what(), false};
      }
      if (!found && !in_flight_.empty()) {
        const auto now = clock::now();
        // The GPU's clock starts when the stream reaches the collective: compute queued before
        // it (a long forward, say) is not the collective's time.
        Entry& front = *in_flight_.front();
        if (!front.seen_started) {
          bool reached = false;
          try {
            reached = front.reached();
          } catch (const std::exception&) {  // a device error: the next look reports it through `finished`
          }
          if (reached) {
            front.seen_started = now;
            if (recorder_) recorder_->started(front.sequence);
          }
        }
        // Only the newest can be settling (queueing is synchronous); it is timed on its own.
        Entry& back = *in_flight_.back();
        if (front.seen_started && now - *front.seen_started > options_.timeout)
          found = failure{rank_, describe_timeout(front), true};
        else if (back.settling && now - *back.seen_started > options_.timeout)
          found = failure{rank_, describe_timeout(back), true};
      }
    }
    if (!found) {
      std::lock_guard lock(mutex_);
      if (handle_.live()) {
        call_result r = handle_.poll(nullptr);
        if (r.state == call_state::failed)
          found = failure{rank_, "NCCL reported an asynchronous error on rank " + std::to_string(rank_) + ": " + r.what,
                          false};
      }
    }
    if (!found)
      if (auto peer = channel_.poll()) {
        found = failure{peer->first, peer->second, false};
        tell = false;
      }
    if (!found) return true;
    fail(std::move(*found), tell);
    return false;
  }

  int rank_;
  std::string where_;
  options options_;
  peer_channel channel_;

  mutable std::mutex mutex_;  // every call on the handle, and aborting it
  Handle handle_;
  bool revoked_ = false;  // under mutex_
  comm::failure_latch latch_;

  std::mutex watch_mutex_;  // the in-flight list and its entries' watch state; never held with mutex_
  std::deque<std::shared_ptr<Entry>> in_flight_;
  comm::flight_recorder* recorder_;  // may be null
  std::optional<comm::watchdog> watchdog_;  // last: stopped first
};

}  // namespace detail
}  // namespace ddp::nccl
