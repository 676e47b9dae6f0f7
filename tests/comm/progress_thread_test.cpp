// The progress queue under the host backends: issue order, who runs what, failures, and the
// watchdog's view, whichever of the progress thread, a waiter or a blocking caller runs an
// operation.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ddp/comm/progress_thread.hpp"

namespace comm_progress_thread_test {

namespace {

// Operations append their index here; the queue runs one at a time, the lock is for TSan's sake.
struct order_log {
  std::mutex mutex;
  std::vector<int> seen;
  void add(int i) {
    std::lock_guard lock(mutex);
    seen.push_back(i);
  }
};

bool eventually(const auto& ready) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!ready())
    if (std::chrono::steady_clock::now() > deadline) return false;
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  return true;
}

}  // namespace

TEST_CASE("run_blocking on an idle queue runs on the calling thread, and the watchdog sees it run") {
  ddp::comm::progress_thread queue;
  std::thread::id ran_on;
  std::uint64_t running = 0;
  queue.run_blocking([&] {
    ran_on = std::this_thread::get_id();
    running = queue.running_op();
  });
  CHECK(ran_on == std::this_thread::get_id());
  CHECK(running != 0);
  CHECK(queue.running_op() == 0);
}

TEST_CASE("run_blocking behind queued operations runs after them, in issue order") {
  ddp::comm::progress_thread queue;
  order_log log;
  std::atomic<bool> release{false};
  auto first = queue.submit([&] {
    while (!release.load()) std::this_thread::yield();
    log.add(0);
  });
  auto second = queue.submit([&] { log.add(1); });
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    release.store(true);
  });
  queue.run_blocking([&] { log.add(2); });
  opener.join();
  CHECK(first.test());
  CHECK(second.test());
  CHECK(log.seen == std::vector<int>{0, 1, 2});
}

TEST_CASE("run_blocking rethrows its operation's failure, and the queue goes on") {
  ddp::comm::progress_thread queue;
  CHECK_THROWS_WITH_AS(queue.run_blocking([] { throw std::runtime_error("rank 1 gave up"); }), "rank 1 gave up",
                       std::runtime_error);
  CHECK(queue.running_op() == 0);
  int ran = 0;
  queue.run_blocking([&] { ++ran; });
  queue.submit([&] { ++ran; }).wait();
  CHECK(ran == 2);
}

TEST_CASE("an operation nobody waits for runs on the progress thread, and says when it ran") {
  // Many rounds: a submission that lands while the progress thread is about to sleep must still
  // wake it (nobody else would run the operation).
  ddp::comm::progress_thread queue(ddp::comm::progress_options{.spin = std::chrono::microseconds(1)});
  for (int round = 0; round < 200; ++round) {
    std::atomic<bool> ran{false};
    std::thread::id ran_on;
    auto w = queue.submit([&] {
      ran_on = std::this_thread::get_id();
      ran.store(true);
    });
    REQUIRE(eventually([&] { return w.test(); }));
    CHECK(ran.load());
    CHECK(ran_on != std::this_thread::get_id());
    CHECK(w.started() <= w.finished());
    if (round % 20 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));  // let it sleep
  }
}

TEST_CASE("operations never overlap, whether the progress thread, a waiter or a blocking caller runs them") {
  ddp::comm::progress_thread queue;
  std::atomic<int> inside{0}, overlaps{0}, ran{0};
  auto op = [&] {
    if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
    for (int i = 0; i < 50; ++i) std::this_thread::yield();
    inside.fetch_sub(1);
    ran.fetch_add(1);
  };
  auto issue = [&](int seed) {
    std::vector<ddp::comm::work> later;
    for (int i = 0; i < 200; ++i) switch ((i + seed) % 3) {
        case 0: queue.run_blocking(op); break;
        case 1: queue.submit(op).wait(); break;
        default: later.push_back(queue.submit(op));
      }
    for (auto& w : later) w.wait();
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) threads.emplace_back(issue, t);
  for (auto& t : threads) t.join();
  CHECK(overlaps.load() == 0);
  CHECK(ran.load() == 600);
}

}  // namespace comm_progress_thread_test
