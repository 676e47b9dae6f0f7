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
}  // namespace detail

// Handle to an operation queued on a progress_thread. Copies share one state.
class work {
 public:
  work() = default;
  explicit work(std::shared_ptr<detail::work_state> s) : state_(std::move(s)) {}

  // Blocks until the operation finished; rethrows its failure (on every call).
  void wait() const {
    if (!state_) return;
    detail::spin_until([&] { return state_->done_flag.load(std::memory_order_acquire); });
    std::unique_lock lock(state_->mutex);
    state_->done_cv.wait(lock, [&] { return state_->done; });
    if (state_->failure) std::rethrow_exception(state_->failure);
  }
  bool test() const noexcept {
    if (!state_) return true;
    std::lock_guard lock(state_->mutex);
    return state_->done;
  }
  // When the operation started and finished on the progress thread (valid once test()).
  std::chrono::steady_clock::time_point started() const { return state_->started; }
  std::chrono::steady_clock::time_point finished() const { return state_->finished; }

 private:
  std::shared_ptr<detail::work_state> state_;
};

static_assert(work_handle<work>);

class progress_thread {
 public:
  progress_thread() : thread_([this] { run(); }) {}
  progress_thread(const progress_thread&) = delete;
  progress_thread& operator=(const progress_thread&) = delete;

  // Finishes every queued operation, then stops.
  ~progress_thread() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    queue_cv_.notify_one();
    thread_.join();
  }

  work submit(std::function<void()> op) {
    auto state = std::make_shared<detail::work_state>();
    {
      std::lock_guard lock(mutex_);
      queue_.emplace_back(std::move(op), state);
      pending_.fetch_add(1, std::memory_order_release);
    }
    queue_cv_.notify_one();
    return work(std::move(state));
  }

 private:
  void run() {
    for (;;) {
      std::pair<std::function<void()>, std::shared_ptr<detail::work_state>> item;
      detail::spin_until([&] { return pending_.load(std::memory_order_acquire) != 0; });
      {
        std::unique_lock lock(mutex_);
        queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
        pending_.fetch_sub(1, std::memory_order_relaxed);
      }
      auto& [op, state] = item;
      std::exception_ptr failure;
      const auto started = std::chrono::steady_clock::now();
      try {
        op();
      } catch (...) {
        failure = std::current_exception();
      }
      {
        std::lock_guard lock(state->mutex);
        state->started = started;
        state->finished = std::chrono::steady_clock::now();
        state->failure = failure;
        state->done = true;
        state->done_flag.store(true, std::memory_order_release);
      }
      state->done_cv.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<detail::work_state>>> queue_;
  bool stopping_ = false;
  std::atomic<int> pending_{0};  // queue_.size(), readable without the lock
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace ddp
