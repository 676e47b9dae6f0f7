#pragma once
// A thread that looks at a communicator's collectives every `poll` and turns one that runs past
// its timeout (or a failure only it can see) into a failure on every rank. Each backend says what
// to look at in `tick`, which returns false once the watchdog has nothing more to do; the
// watchdog stops (and joins) when it is destroyed.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace ddp::comm {

class watchdog {
 public:
  watchdog(std::chrono::milliseconds poll, std::function<bool()> tick, std::function<void()> on_start = {})
      : poll_(poll), tick_(std::move(tick)), thread_([this, start = std::move(on_start)] {
          if (start) start();
          run();
        }) {}
  watchdog(const watchdog&) = delete;
  watchdog& operator=(const watchdog&) = delete;
  ~watchdog() { stop(); }

  // Stops the thread (idempotent); a tick in progress finishes first.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      cv_.wait_for(lock, poll_);
      if (stopping_) return;
      lock.unlock();
      const bool more = tick_();
      lock.lock();
      if (!more) return;
    }
  }

  std::chrono::milliseconds poll_;
  std::function<bool()> tick_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members it uses exist
};

}  // namespace ddp::comm
