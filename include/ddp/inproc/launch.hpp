#pragma once
// Runs a function on N in-process ranks, one thread each, and returns what each returned, or
// throws a ddp::inproc::launch_error that reports every rank's error.
#include <algorithm>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "ddp/core/cpu_affinity.hpp"
#include "ddp/inproc/communicator.hpp"

namespace ddp::inproc {

// What launch throws when ranks failed: the rank at fault and its error first, then every other
// rank's error (a peer's is usually "cannot complete ... because rank r failed"). Ranks that
// raised the same error (the same text but for their own rank) share one line that names them all,
// "ranks 0, 1: ...", so an error raised on every rank is reported once. The failing rank's own
// exception is nested in it: std::rethrow_if_nested(e) throws it again with its own type.
class launch_error : public error {
 public:
  // `ended`: why a launcher that goes on after failures (launch_elastic) stops here, when it says.
  launch_error(int origin, std::vector<std::string> rank_errors, const std::string& ended = "")
      : error("inproc", "launch", origin, summary(origin, rank_errors) + (ended.empty() ? "" : "\n  the run ends: " + ended)),
        origin_(origin),
        rank_errors_(std::move(rank_errors)) {}
  // The rank whose failure made the others fail.
  int origin_rank() const noexcept { return origin_; }
  // Each rank's error message, by rank (empty for a rank that returned normally).
  const std::vector<std::string>& rank_errors() const noexcept { return rank_errors_; }

 private:
  // A ddp::error's text without its own rank: "ddp[trainer] step on rank 1: x" -> the head
  // "ddp[trainer] step" and the rest "x"; any other text is all rest.
  struct rank_free {
    std::string head, rest;
    bool operator==(const rank_free&) const = default;
  };
  static rank_free without_rank(const std::string& message, std::size_t rank) {
    const std::string mark = " on rank " + std::to_string(rank) + ": ";
    const auto at = message.find(mark);
    const auto colon = message.find(": ");
    if (message.starts_with("ddp[") && at != std::string::npos && at + mark.size() - 2 == colon)
      return {message.substr(0, at), message.substr(at + mark.size())};
    return {"", message};
  }
  static std::string rank_list(const std::vector<std::size_t>& ranks) {
    std::string s = ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
    return s;
  }
  static std::string summary(int origin, const std::vector<std::string>& errors) {
    // Group the failed ranks by their error without the rank, the origin's group first.
    std::vector<rank_free> keys;
    std::vector<std::vector<std::size_t>> groups;
    auto add = [&](std::size_t r) {
      if (errors[r].empty()) return;
      const auto key = without_rank(errors[r], r);
      std::size_t g = 0;
      while (g < keys.size() && !(keys[g] == key)) ++g;
      if (g == keys.size()) keys.push_back(key), groups.emplace_back();
      if (std::find(groups[g].begin(), groups[g].end(), r) == groups[g].end()) groups[g].push_back(r);
    };
    add(static_cast<std::size_t>(origin));
    for (std::size_t r = 0; r < errors.size(); ++r) add(r);
    for (auto& g : groups) std::sort(g.begin(), g.end());
    std::string s;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const auto& [head, rest] = keys[g];
      const bool one = groups[g].size() == 1;
      if (g == 0)  // the origin's: "ddp[x] op on ranks 0, 1: ..." when several ranks raised it
        s = one ? errors[groups[g][0]]
                : (head.empty() ? rank_list(groups[g]) + ": " : head + " on " + rank_list(groups[g]) + ": ") + rest;
      else
        s += "\n  " + rank_list(groups[g]) + ": " +
             (one ? errors[groups[g][0]] : (head.empty() ? rest : head + ": " + rest));
    }
    return s;
  }
  int origin_;
  std::vector<std::string> rank_errors_;
};

namespace launch_detail {

// What each rank of one run of fn did: its result, or its exception (and the order they failed in).
template <class Result>
struct rank_outcomes {
  using stored = std::conditional_t<std::is_void_v<Result>, char, std::optional<Result>>;
  std::shared_ptr<inproc::world> world;
  std::vector<std::exception_ptr> failures;
  std::vector<int> failure_order;
  std::vector<stored> results;

  bool failed() const noexcept { return !failure_order.empty(); }
  // The root cause: the rank the world blames, else the first to fail (a failure's origin may be
  // unknown, -1).
  int origin() const {
    int o = world->failed_rank().value_or(failure_order.front());
    if (o < 0 || o >= world->size() || !failures[static_cast<std::size_t>(o)]) o = failure_order.front();
    return o;
  }
  std::string message_of(int rank) const {
    if (!failures[static_cast<std::size_t>(rank)]) return "";
    try {
      std::rethrow_exception(failures[static_cast<std::size_t>(rank)]);
    } catch (const std::exception& e) {
      return e.what();
    } catch (...) {
      return "unknown exception";
    }
  }
  [[noreturn]] void throw_launch_error(const std::string& ended = "") const {
    const int o = origin();
    std::vector<std::string> messages(failures.size());
    for (std::size_t r = 0; r < failures.size(); ++r) messages[r] = message_of(static_cast<int>(r));
    try {
      std::rethrow_exception(failures[static_cast<std::size_t>(o)]);
    } catch (...) {
      std::throw_with_nested(launch_error(o, std::move(messages), ended));
    }
  }
  auto take_results() {
    if constexpr (!std::is_void_v<Result>) {
      std::vector<Result> out;
      out.reserve(results.size());
      for (auto& r : results) out.push_back(std::move(*r));
      return out;
    }
  }
};

// Runs fn(communicator&) on every rank of a new world (with `handoff` attached) and reports what
// each did; throws nothing of the ranks'.
template <class F>
auto run_ranks(int world_size, F& fn, const options& opts, elastic::handoff* handoff = nullptr) {
  using result = std::invoke_result_t<F&, communicator&>;
  rank_outcomes<result> out;
  out.world = std::make_shared<world>(world_size, opts);
  out.world->set_handoff(handoff);
  out.failures.resize(static_cast<std::size_t>(world_size));
  out.results.resize(static_cast<std::size_t>(world_size));
  auto& w = out.world;
  std::mutex order_mutex;

  const std::vector<int> cpus = opts.bind_to_cores ? detail::usable_cpus() : std::vector<int>{};
  auto body = [&](int rank) {
    try {
      if (!cpus.empty()) try {
          detail::bind_this_thread(cpus[static_cast<std::size_t>(rank) % cpus.size()], "inproc", rank);
        } catch (const std::exception& e) {
          w->fail(rank, e.what());
          throw;
        }
      communicator comm(w, rank);
      try {
        if constexpr (std::is_void_v<result>) {
          fn(comm);
        } else {
          out.results[static_cast<std::size_t>(rank)] = fn(comm);
        }
        comm.barrier().wait();  // finish pending collectives; peers' failures surface here
      } catch (const elastic::regroup&) {
        throw;  // every rank ends its membership at the same step boundary: nobody waits for it
      } catch (const std::exception& e) {
        w->fail(rank, e.what());
        throw;
      } catch (...) {
        w->fail(rank, "unknown exception");
        throw;
      }
    } catch (...) {
      out.failures[static_cast<std::size_t>(rank)] = std::current_exception();
      std::lock_guard lock(order_mutex);
      out.failure_order.push_back(rank);
    }
    w->leave(rank);
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace launch_detail

// fn(communicator&) runs on every rank. When a rank throws, every other rank's pending and
// later collectives throw ddp::peer_error; launch then throws a launch_error naming every
// rank's error, with the failing rank's own exception nested.
template <class F>
auto launch(int world_size, F&& fn, options opts = {}) {
  auto out = launch_detail::run_ranks(world_size, fn, opts);
  if (out.failed()) out.throw_launch_error();
  return out.take_results();
}

}  // namespace ddp::inproc
