#pragma once
// A FIFO queue of operations run by one background thread, and the work handle each submitted
// operation returns. Host backends use it to run collectives asynchronously in issue order.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "ddp/concepts/work.hpp"
#include "ddp/core/spin_wait.hpp"

namespace ddp {

namespace detail {
struct work_state {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::atomic<bool> done_flag{false};  // `done`, readable without the lock
  std::exception_ptr failure;
  std::chrono::steady_clock::time_point started, finished;
};

struct queued_op {
  std::function<void()> op;
  std::shared_ptr<work_state> state;
};

// The FIFO shared by the progress thread and threads that wait for a work handle. Whoever takes
// the head runs it; one at a time (`running`), so operations still run in issue order.
struct op_queue {
  std::mutex mutex;
  std::condition_variable cv;  // an operation was queued or finished, or stopping
  std::deque<queued_op> ops;
  bool running = false;
  bool stopping = false;
  std::atomic<int> pending{0};  // ops.size(), readable without the lock
  const std::chrono::microseconds spin;  // how long a thread spins before it sleeps

  explicit op_queue(std::chrono::microseconds spin_budget) : spin(spin_budget) {}

  bool runnable() const { return !running && !ops.empty(); }

  // Caller holds `lock` and saw runnable(): runs the head outside the lock.
  void run_head(std::unique_lock<std::mutex>& lock) {
    queued_op item = std::move(ops.front());
    ops.pop_front();
    pending.fetch_sub(1, std::memory_order_relaxed);
    running = true;
    lock.unlock();
    std::exception_ptr failure;
    const auto started = std::chrono::steady_clock::now();
    try {
      item.op();
    } catch (...) {
      failure = std::current_exception();
    }
    {
      std::lock_guard state_lock(item.state->mutex);
      item.state->started = started;
      item.state->finished = std::chrono::steady_clock::now();
      item.state->failure = failure;
      item.state->done = true;
      item.state->done_flag.store(true, std::memory_order_release);
    }
    item.state->done_cv.notify_all();
    lock.lock();
    running = false;
    cv.notify_all();
  }
};
}  // namespace detail

// Handle to an operation queued on a progress_thread. Copies share one state.
class work {
 public:
  work() = default;
  work(std::shared_ptr<detail::work_state> s, std::shared_ptr<detail::op_queue> q)
      : state_(std::move(s)), queue_(std::move(q)) {}

  // Blocks until the operation finished; rethrows its failure (on every call). A waiter whose
  // operation is still queued runs the queue's head itself instead of sleeping until the
  // progress thread gets a core: on machines with as many busy ranks as cores that wake-up is
  // most of a small collective's cost.
  void wait() const {
    if (!state_) return;
    if (!state_->done_flag.load(std::memory_order_acquire) && queue_) {
      std::unique_lock lock(queue_->mutex);
      while (!state_->done_flag.load(std::memory_order_acquire)) {
        if (queue_->runnable()) {
          queue_->run_head(lock);
          continue;
        }
        lock.unlock();  // another thread runs an operation, perhaps this one: spin a while
        const bool done = detail::spin_until([&] { return state_->done_flag.load(std::memory_order_acquire); },
                                             queue_->spin);
        lock.lock();
        if (!done && !queue_->runnable() && !state_->done_flag.load(std::memory_order_acquire)) queue_->cv.wait(lock);
      }
    }
    std::unique_lock lock(state_->mutex);
    state_->done_cv.wait(lock, [&] { return state_->done; });
    if (state_->failure) std::rethrow_exception(state_->failure);
  }
  bool test() const noexcept {
    if (!state_) return true;
    std::lock_guard lock(state_->mutex);
    return state_->done;
  }
  // When the operation started and finished (valid once test()).
  std::chrono::steady_clock::time_point started() const { return state_->started; }
  std::chrono::steady_clock::time_point finished() const { return state_->finished; }

 private:
  std::shared_ptr<detail::work_state> state_;
  std::shared_ptr<detail::op_queue> queue_;
};

static_assert(work_handle<work>);

class progress_thread {
 public:
  // `spin`: how long the thread, and a waiter on its operations, spin before sleeping
  // (see spin_wait.hpp).
  explicit progress_thread(std::chrono::microseconds spin = detail::spin_budget)
      : queue_(std::make_shared<detail::op_queue>(spin)), thread_([this] { run(); }) {}
  progress_thread(const progress_thread&) = delete;
  progress_thread& operator=(const progress_thread&) = delete;

  // Finishes every queued operation, then stops.
  ~progress_thread() {
    {
      std::lock_guard lock(queue_->mutex);
      queue_->stopping = true;
    }
    queue_->cv.notify_all();
    thread_.join();
  }

  work submit(std::function<void()> op) {
    auto state = std::make_shared<detail::work_state>();
    {
      std::lock_guard lock(queue_->mutex);
      queue_->ops.push_back({std::move(op), state});
      queue_->pending.fetch_add(1, std::memory_order_release);
    }
    queue_->cv.notify_all();
    return work(std::move(state), queue_);
  }

 private:
  void run() {
    auto& q = *queue_;
    for (;;) {
      detail::spin_until([&] { return q.pending.load(std::memory_order_acquire) != 0; }, q.spin);
      std::unique_lock lock(q.mutex);
      q.cv.wait(lock, [&] { return q.runnable() || (q.stopping && q.ops.empty() && !q.running); });
      if (!q.runnable()) return;
      q.run_head(lock);
    }
  }

  std::shared_ptr<detail::op_queue> queue_;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace ddp
