#pragma once
// A FIFO queue of operations run in issue order, one at a time, and the work handle each
// submitted operation returns. Host backends use it to run collectives asynchronously.
//
// Whoever gets to the head of the queue first runs it: the queue's progress thread, or a thread
// waiting for one of its operations (on machines with as many busy ranks as cores, the progress
// thread's wake-up is most of a small collective's cost). The progress thread spins a while
// after each operation, then sleeps until a submission wakes it. The queue's lock is held
// briefly (except by run_blocking, below), and nothing calls into the kernel unless a thread
// sleeps. A submitted operation costs one allocation and two clock reads (its work handle says
// when it ran); run_blocking() on an idle queue costs neither: it runs the operation at once on
// the calling thread.
#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "ddp/concepts/work.hpp"
#include "ddp/core/issue_mode.hpp"
#include "ddp/core/spin_wait.hpp"

namespace ddp::comm {

struct progress_options {
  // How long the progress thread, and a thread waiting for an operation, spin before they sleep
  // (spin_wait.hpp).
  std::chrono::microseconds spin = ddp::detail::spin_budget;
  std::chrono::microseconds grace{10};  // see progress_thread::grace_over
};

namespace detail {
struct work_state {
  std::atomic<bool> done{false};
  std::exception_ptr failure;  // written before `done`
  std::chrono::steady_clock::time_point started, finished;
  virtual ~work_state() = default;
  virtual void run() = 0;  // runs the operation, then releases what it captured
};

// The operation lives in its state: one allocation per submission.
template <class Op>
struct work_state_of final : work_state {
  explicit work_state_of(Op&& o) : op(std::move(o)) {}
  void run() override {
    struct release {
      std::optional<Op>& op;
      ~release() { op.reset(); }
    } on_return{op};
    (*op)();
  }
  std::optional<Op> op;
};

struct op_queue {
  std::mutex mutex;
  std::condition_variable progress_cv;  // the progress thread sleeps here
  std::condition_variable waiters_cv;   // threads waiting for an operation sleep here
  std::deque<std::shared_ptr<work_state>> ops;
  bool stopping = false;
  int waiters_asleep = 0;
  bool progress_asleep = false;
  // Readable without the lock, for spinning and for a watchdog: ops.size(), and the number of
  // the operation running now (operations count from 1 in the order they start; 0: none runs;
  // written under the lock).
  std::atomic<int> pending{0};
  std::atomic<std::uint64_t> running_op{0};
  std::atomic<std::uint64_t> started_ops{0};  // written under the lock
  // Set once, from outside, when a peer is known to be gone (progress_thread::break_queue): every
  // waiter and every later submission fails with it, even while an operation never returns.
  std::exception_ptr broken;  // written under the lock, before `is_broken`
  std::atomic<bool> is_broken{false};
  // Whether a waiting thread may run queued operations itself (progress_thread::make_interruptible).
  std::atomic<bool> waiters_run{true};
  const progress_options options;

  explicit op_queue(progress_options o) : options(o) {}

  // Caller holds the lock.
  bool running() const { return running_op.load(std::memory_order_relaxed) != 0; }
  bool runnable() const { return !running() && !ops.empty(); }
  bool maybe_runnable() const {
    return pending.load(std::memory_order_acquire) != 0 && running_op.load(std::memory_order_acquire) == 0;
  }

  // Caller holds the lock and saw nothing running.
  void begin_running() {
    const std::uint64_t n = started_ops.load(std::memory_order_relaxed) + 1;
    started_ops.store(n, std::memory_order_relaxed);
    running_op.store(n, std::memory_order_relaxed);
  }
  // Caller holds the lock.
  void end_running() {
    running_op.store(0, std::memory_order_release);
    if (waiters_asleep) waiters_cv.notify_all();
    if (!ops.empty() && progress_asleep) progress_cv.notify_one();  // a waiter ran this one: the rest are the thread's
  }

  // Caller holds `lock` and saw runnable(): runs the head outside the lock; holds it again on return.
  void run_head(std::unique_lock<std::mutex>& lock) {
    std::shared_ptr<work_state> item = std::move(ops.front());
    ops.pop_front();
    pending.fetch_sub(1, std::memory_order_relaxed);
    begin_running();
    lock.unlock();
    auto& state = *item;
    state.started = std::chrono::steady_clock::now();
    try {
      state.run();
    } catch (...) {
      state.failure = std::current_exception();
    }
    state.finished = std::chrono::steady_clock::now();
    state.done.store(true, std::memory_order_release);
    lock.lock();
    end_running();
  }
};
}  // namespace detail

// Handle to an operation queued on a progress_thread. Copies share one state.
class work {
 public:
  work() = default;
  work(std::shared_ptr<detail::work_state> s, std::shared_ptr<detail::op_queue> q)
      : state_(std::move(s)), queue_(std::move(q)) {}

  // Blocks until the operation finished, running queued operations (this one and those before
  // it) itself when no other thread runs them; rethrows its failure (on every call).
  void wait() const {
    if (!state_) return;
    if (!is_done()) {
      auto& q = *queue_;
      std::unique_lock lock(q.mutex);
      while (!is_done()) {
        if (q.broken) std::rethrow_exception(q.broken);
        const bool may_run = q.waiters_run.load(std::memory_order_relaxed);
        if (may_run && q.runnable()) {
          q.run_head(lock);
          continue;
        }
        lock.unlock();  // another thread runs an operation, perhaps this one
        ddp::detail::spin_until(
            [&] { return is_done() || (may_run && q.maybe_runnable()) || q.is_broken.load(std::memory_order_acquire); },
            q.options.spin, ddp::detail::spin_kind::for_core);
        lock.lock();
        if (!is_done() && !(may_run && q.runnable()) && !q.broken) {
          ++q.waiters_asleep;
          q.waiters_cv.wait(lock);
          --q.waiters_asleep;
        }
      }
    }
    if (state_->failure) std::rethrow_exception(state_->failure);
  }
  bool test() const noexcept { return !state_ || is_done(); }
  // When the operation started and finished (valid once test()).
  std::chrono::steady_clock::time_point started() const { return state_->started; }
  std::chrono::steady_clock::time_point finished() const { return state_->finished; }

 private:
  bool is_done() const noexcept { return state_->done.load(std::memory_order_acquire); }

  std::shared_ptr<detail::work_state> state_;
  std::shared_ptr<detail::op_queue> queue_;
};

static_assert(work_handle<work>);

class progress_thread {
 public:
  explicit progress_thread(progress_options options = {})
      : queue_(std::make_shared<detail::op_queue>(options)), thread_([this] { run(); }) {}
  progress_thread(const progress_thread&) = delete;
  progress_thread& operator=(const progress_thread&) = delete;

  // Finishes every queued operation, then stops. A broken queue's thread may be inside an
  // operation that never returns: it is left behind, with the queue (the process is about to
  // end: ddp::run::agent ends it once its trainers handed their state over).
  ~progress_thread() {
    if (queue_->is_broken.load(std::memory_order_acquire)) {
      new std::shared_ptr<detail::op_queue>(queue_);  // kept for the thread left behind
      thread_.detach();
      return;
    }
    {
      std::lock_guard lock(queue_->mutex);
      queue_->stopping = true;
    }
    queue_->progress_cv.notify_all();
    thread_.join();
  }

  // The number of the operation running now (on whichever thread runs it; operations count
  // from 1 in the order they start), or 0: read without a lock, for a watchdog that times how
  // long one operation runs.
  std::uint64_t running_op() const noexcept { return queue_->running_op.load(std::memory_order_acquire); }

  // Fails every waiter and every later submission with `why`, at once: for a peer known to be
  // gone while an operation waits for it (never returning). Runs on any thread.
  void break_queue(std::exception_ptr why) {
    {
      std::lock_guard lock(queue_->mutex);
      if (queue_->broken) return;
      queue_->broken = std::move(why);
      queue_->is_broken.store(true, std::memory_order_release);
    }
    queue_->waiters_cv.notify_all();
    queue_->progress_cv.notify_all();
  }
  bool broken() const noexcept { return queue_->is_broken.load(std::memory_order_acquire); }
  // Operations that could wait for a peer forever must run where a broken queue can stop the
  // wait: only the progress thread runs them then (run_blocking() submits and waits; a waiter
  // never takes the head). Before the first submission.
  void make_interruptible() noexcept { queue_->waiters_run.store(false, std::memory_order_relaxed); }

  template <std::invocable Op>
  work submit(Op op) {
    std::shared_ptr<detail::work_state> state = std::make_shared<detail::work_state_of<Op>>(std::move(op));
    auto& q = *queue_;
    bool wake = false;
    {
      std::lock_guard lock(q.mutex);
      if (q.broken) std::rethrow_exception(q.broken);
      q.ops.push_back(state);
      q.pending.fetch_add(1, std::memory_order_release);
      wake = q.progress_asleep;
    }
    if (wake) q.progress_cv.notify_one();
    return work(std::move(state), queue_);
  }

  // submit(op).wait(), without the handle: when nothing is queued or running, `op` runs at once
  // on the calling thread, and nothing is allocated or timed. Its exception propagates. It runs
  // holding the queue's lock (one lock where taking it twice would cost as much as the rest):
  // nothing else may start meanwhile anyway, and a thread that wants the queue waits its turn.
  template <std::invocable Op>
  void run_blocking(Op op) {
    auto& q = *queue_;
    std::unique_lock lock(q.mutex);
    if (!q.ops.empty() || q.running() || !q.waiters_run.load(std::memory_order_relaxed)) {
      lock.unlock();
      submit(std::move(op)).wait();
      return;
    }
    q.begin_running();
    struct end_running {
      detail::op_queue& q;
      ~end_running() { q.end_running(); }  // before the lock goes
    } guard{q};
    op();
  }

  // submit(op) or run_blocking(op), as `how` asks.
  template <issue_mode How, std::invocable Op>
  auto issue(How, Op op) {
    if constexpr (std::same_as<How, blocking_t>)
      run_blocking(std::move(op));
    else
      return submit(std::move(op));
  }

 private:
  void run() {
    auto& q = *queue_;
    std::unique_lock lock(q.mutex);
    for (;;) {
      if (q.broken) return;  // nothing more runs (its owner may be gone: touch only the queue)
      if (q.runnable()) {
        q.run_head(lock);
        continue;
      }
      if (q.stopping && q.ops.empty() && !q.running()) return;
      lock.unlock();
      // Waiters that never run operations leave nothing to wait for.
      const bool waiters_run = q.waiters_run.load(std::memory_order_relaxed);
      const bool more = ddp::detail::spin_until(
          [&] { return q.is_broken.load(std::memory_order_acquire) || (q.maybe_runnable() && (!waiters_run || grace_over())); },
          q.options.spin, ddp::detail::spin_kind::for_core);
      lock.lock();
      // Runnable, or a waiter took it meanwhile: spin again. A submission between the spin and
      // the lock found this thread awake and did not wake it: look once more before sleeping.
      if (more || q.runnable()) continue;
      q.progress_asleep = true;
      if (q.stopping)  // until a waiter's operation ends
        q.progress_cv.wait_for(lock, q.options.spin);
      else
        q.progress_cv.wait(lock);
      q.progress_asleep = false;
    }
  }

  // The progress thread leaves a fresh submission to its submitter for a moment: a caller that
  // waits at once runs it on its own thread, without handing it over. The moment counts from
  // when this thread first saw the operation at the head (the submitter reads no clock), so a
  // burst of submissions does not hold the first back.
  bool grace_over() {
    const std::uint64_t head = queue_->started_ops.load(std::memory_order_relaxed);
    const auto now = std::chrono::steady_clock::now();
    if (!head_seen_since_ || head != head_seen_) {
      head_seen_ = head;
      head_seen_since_ = now;
      return false;
    }
    return now - *head_seen_since_ >= queue_->options.grace;
  }

  std::shared_ptr<detail::op_queue> queue_;
  // The progress thread's own: the head it saw waiting (by the operations started before it), and since when.
  std::uint64_t head_seen_ = 0;
  std::optional<std::chrono::steady_clock::time_point> head_seen_since_;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace ddp::comm
