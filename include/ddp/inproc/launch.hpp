#pragma once
// Runs a function on N in-process ranks, one thread each, and returns what each returned
// (or rethrows the failure of the rank that failed first).
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include "ddp/inproc/communicator.hpp"

namespace ddp::inproc {

// fn(communicator&) runs on every rank. When a rank throws, every other rank's pending and
// later collectives throw ddp::peer_error; launch then rethrows the first rank's exception.
template <class F>
auto launch(int world_size, F&& fn, options opts = {}) {
  using result = std::invoke_result_t<F&, communicator&>;
  auto w = std::make_shared<world>(world_size, opts);
  std::vector<std::exception_ptr> failures(world_size);
  std::mutex order_mutex;
  std::vector<int> failure_order;
  using stored = std::conditional_t<std::is_void_v<result>, char, std::optional<result>>;
  std::vector<stored> results(world_size);

  auto body = [&](int rank) {
    try {
      communicator comm(w, rank);
      try {
        if constexpr (std::is_void_v<result>) {
          fn(comm);
        } else {
          results[rank] = fn(comm);
        }
        comm.barrier().wait();  // finish pending collectives; peers' failures surface here
      } catch (const std::exception& e) {
        w->fail(rank, e.what());
        throw;
      } catch (...) {
        w->fail(rank, "unknown exception");
        throw;
      }
    } catch (...) {
      failures[rank] = std::current_exception();
      std::lock_guard lock(order_mutex);
      failure_order.push_back(rank);
    }
    w->leave(rank);
  };

  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < world_size; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();

  if (!failure_order.empty()) {
    // The root cause: the rank the world blames, else the first to fail.
    const int origin = w->failed_rank().value_or(failure_order.front());
    std::rethrow_exception(failures[origin] ? failures[origin] : failures[failure_order.front()]);
  }
  if constexpr (!std::is_void_v<result>) {
    std::vector<result> out;
    out.reserve(world_size);
    for (auto& r : results) out.push_back(std::move(*r));
    return out;
  }
}

}  // namespace ddp::inproc
