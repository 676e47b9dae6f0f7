#pragma once
// A FIFO queue of operations run in issue order, one at a time, and the work handle each
// submitted operation returns. Host backends use it to run collectives asynchronously.
//
// Whoever gets to the head of the queue first runs it: the queue's progress thread, or a thread
// waiting for one of its operations (on machines with as many busy ranks as cores, the progress
// thread's wake-up is most of a small collective's cost). The progress thread spins a while
// after each operation, then sleeps until a submission wakes it. Nothing on the way takes a
// lock that another thread holds for long, and nothing calls into the kernel unless a thread
// sleeps: a small collective costs a few hundred nanoseconds of bookkeeping.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "ddp/concepts/work.hpp"
#include "ddp/core/spin_wait.hpp"

namespace ddp {

struct progress_options {
  // How long the progress thread, and a thread waiting for an operation, spin before they sleep
  // (spin_wait.hpp).
  std::chrono::microseconds spin = detail::spin_budget;
  std::chrono::microseconds grace{10};  // see op_queue::grace_over
};

namespace detail {
struct work_state {
  std::atomic<bool> done{false};
  std::exception_ptr failure;  // written before `done`
  std::chrono::steady_clock::time_point started, finished;
};

struct queued_op {
  std::function<void()> op;
  std::shared_ptr<work_state> state;
};

struct op_queue {
  std::mutex mutex;
  std::condition_variable progress_cv;  // the progress thread sleeps here
  std::condition_variable waiters_cv;   // threads waiting for an operation sleep here
  std::deque<queued_op> ops;
  bool running = false;
  bool stopping = false;
  int waiters_asleep = 0;
  bool progress_asleep = false;
  // Readable without the lock, for spinning: ops.size() and `running`.
  std::atomic<int> pending{0};
  std::atomic<bool> busy{false};
  std::atomic<std::chrono::steady_clock::rep> last_submit{0};
  // When the operation running now started (its work_state's `started`), for a watchdog; 0: none.
  std::atomic<std::chrono::steady_clock::rep> running_since{0};
  const progress_options options;

  explicit op_queue(progress_options o) : options(o) {}

  bool runnable() const { return !running && !ops.empty(); }
  // The progress thread leaves a fresh submission to its submitter for a moment: a caller that
  // waits at once runs it on its own thread, without handing it over. The moment counts from
  // when the queue stopped being empty, so a burst of submissions does not hold the first back.
  bool grace_over() const {
    return std::chrono::steady_clock::now().time_since_epoch().count() - last_submit.load(std::memory_order_relaxed) >=
           std::chrono::nanoseconds(options.grace).count();
  }
  bool maybe_runnable() const {
    return pending.load(std::memory_order_acquire) != 0 && !busy.load(std::memory_order_acquire);
  }

  // Caller holds `lock` and saw runnable(): runs the head outside the lock; holds it again on return.
  void run_head(std::unique_lock<std::mutex>& lock) {
    queued_op item = std::move(ops.front());
    ops.pop_front();
    pending.fetch_sub(1, std::memory_order_relaxed);
    running = true;
    busy.store(true, std::memory_order_relaxed);
    lock.unlock();
    auto& state = *item.state;
    state.started = std::chrono::steady_clock::now();
    running_since.store(state.started.time_since_epoch().count() | 1, std::memory_order_relaxed);  // never 0
    try {
      item.op();
    } catch (...) {
      state.failure = std::current_exception();
    }
    state.finished = std::chrono::steady_clock::now();
    running_since.store(0, std::memory_order_relaxed);
    state.done.store(true, std::memory_order_release);
    lock.lock();
    running = false;
    busy.store(false, std::memory_order_release);
    if (waiters_asleep) waiters_cv.notify_all();
    if (!ops.empty() && progress_asleep) progress_cv.notify_one();  // a waiter ran this one: the rest are the thread's
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
        if (q.runnable()) {
          q.run_head(lock);
          continue;
        }
        lock.unlock();  // another thread runs an operation, perhaps this one
        detail::spin_until([&] { return is_done() || q.maybe_runnable(); }, q.options.spin, detail::spin_kind::for_core);
        lock.lock();
        if (!is_done() && !q.runnable()) {
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

  // Finishes every queued operation, then stops.
  ~progress_thread() {
    {
      std::lock_guard lock(queue_->mutex);
      queue_->stopping = true;
    }
    queue_->progress_cv.notify_all();
    thread_.join();
  }

  // When the operation running now started (on whichever thread runs it), or nothing: a
  // watchdog's clock, read without a lock.
  std::optional<std::chrono::steady_clock::time_point> running_since() const noexcept {
    const auto since = queue_->running_since.load(std::memory_order_relaxed);
    if (since == 0) return std::nullopt;
    return std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(since));
  }

  work submit(std::function<void()> op) {
    auto state = std::make_shared<detail::work_state>();
    auto& q = *queue_;
    bool wake = false;
    {
      std::lock_guard lock(q.mutex);
      q.ops.push_back({std::move(op), state});
      q.pending.fetch_add(1, std::memory_order_release);
      if (q.ops.size() == 1)  // grace counts from when the queue stopped being empty
        q.last_submit.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
      wake = q.progress_asleep;
    }
    if (wake) q.progress_cv.notify_one();
    return work(std::move(state), queue_);
  }

 private:
  void run() {
    auto& q = *queue_;
    std::unique_lock lock(q.mutex);
    for (;;) {
      if (q.runnable()) {
        q.run_head(lock);
        continue;
      }
      if (q.stopping && q.ops.empty() && !q.running) return;
      lock.unlock();
      const bool more = detail::spin_until([&] { return q.maybe_runnable() && q.grace_over(); }, q.options.spin,
                                           detail::spin_kind::for_core);
      lock.lock();
      if (more) continue;  // runnable, or a waiter took it meanwhile: spin again
      q.progress_asleep = true;
      if (q.stopping)  // until a waiter's operation ends
        q.progress_cv.wait_for(lock, q.options.spin);
      else
        q.progress_cv.wait(lock);
      q.progress_asleep = false;
    }
  }

  std::shared_ptr<detail::op_queue> queue_;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace ddp
