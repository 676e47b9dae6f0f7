#pragma once
// ddp-bench collective: an nccl-tests-style sweep of one collective over any communicator. For
// every size, dtype and reduction: time, algbw and busbw out of place and in place (the blocking
// form a caller that wants the result uses), the number of wrong elements (-c), a baseline
// measured in the same run beside them, and the asynchronous form (issued, then waited for).
// Sizes mean what nccl-tests means: the bytes of the whole buffer (all_reduce and broadcast: the buffer;
// reduce_scatter: the input of all ranks' parts; all_gather: the output), and busbw = algbw x
// the collective's factor: all_reduce 2(n-1)/n, reduce_scatter and all_gather (n-1)/n,
// broadcast 1. A wrong element fails the run: run_sweep returns how many the checks found and
// sweep_exit_status turns that into the exit status. On one rank an in-place call has nothing to
// move (its input is its output): its result is checked, its time is not reported (n/a).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ddp_bench/report.hpp"
#include "ddp/comm/collectives.hpp"

namespace bench {

using clock_type = std::chrono::steady_clock;

enum class collective_kind { all_reduce, reduce_scatter, all_gather, broadcast };

struct collective_params {
  std::string collective = "all_reduce";
  std::string backend = "inproc";
  int ranks = 2;                 // in-process ranks (inproc), or GPUs (nccl); mpirun decides for mpi
  std::size_t min_bytes = 8;     // -b
  std::size_t max_bytes = std::size_t{64} << 20;  // -e
  double step_factor = 2;        // -f (used when > 1)
  std::size_t step_bytes = 0;    // -i (used when -f is 1)
  int iters = 20;                // -n
  int warmup = 5;                // -w
  int check = 1;                 // -c
  bool inject_wrong = false;     // tests: alter one element of each checked result on rank 0
  int repeats = 3;               // batches of -n iterations; the best is kept
  int average = 3;               // -a: across ranks 0 rank 0, 1 mean, 2 min, 3 max (nccl-tests' meaning)
  std::vector<std::string> dtypes{"float"};
  std::vector<std::string> ops{"sum"};
  int root = 0;
  bool bind = false;             // inproc: bind each rank's thread to a core of its own (inproc::options)
  std::string out;
};

// Seconds per call of each of `calls`: `p.warmup` untimed calls of each, then `p.repeats` rounds
// in which each call in turn runs a batch of `p.iters` after `start()` (a barrier, so that the
// ranks begin together); each call's best batch (a shared machine's least disturbed) is kept.
// The calls take turns batch by batch, so a ratio between them compares the same moments of the
// machine, not whichever ran first.
inline std::vector<double> best_seconds_per_call(const collective_params& p,
                                                 const std::vector<std::function<void()>>& calls,
                                                 const std::function<void()>& start) {
  for (const auto& call : calls)
    for (int i = 0; i < p.warmup; ++i) call();
  std::vector<double> best(calls.size(), 1e300);
  for (int r = 0; r < p.repeats; ++r)
    for (std::size_t c = 0; c < calls.size(); ++c) {
      start();
      const auto t0 = clock_type::now();
      for (int i = 0; i < p.iters; ++i) calls[c]();
      best[c] = std::min(best[c], std::chrono::duration<double>(clock_type::now() - t0).count() / p.iters);
    }
  return best;
}

collective_kind parse_collective(const std::string& name);
std::vector<std::size_t> sweep_sizes(const collective_params& p);
std::vector<ddp::dtype> parse_dtypes(const std::vector<std::string>& names);
std::vector<ddp::reduce_op> parse_ops(const std::vector<std::string>& names);
double bus_factor(collective_kind k, int ranks);
std::vector<column> collective_columns();

// The element counts of one call at `bytes`: every rank's send and recv.
struct call_shape {
  std::size_t send = 0, recv = 0;
};
call_shape shape_of(collective_kind k, std::size_t bytes, ddp::dtype t, int ranks);

// Integer-valued inputs (exact in every dtype): the conformance suite's (tests/conformance/expected.hpp).
void fill_input(ddp::dtype t, void* data, std::size_t count, int rank, std::size_t first_index);
// Elements of `got` that differ from what the collective must produce on `rank`.
long long count_wrong(collective_kind k, ddp::dtype t, ddp::reduce_op op, const void* got, std::size_t count, int rank,
                      int ranks, int root);

// Memory the sweep's buffers live in: host vectors, or device memory.
template <class M>
concept sweep_memory = requires(M& m, typename M::array& a, const typename M::array& ca, void* p, const void* cp,
                                std::size_t n) {
  { m.allocate(n) } -> std::same_as<typename M::array>;
  { a.data() } -> std::convertible_to<void*>;
  m.upload(a, cp, n);
  m.download(p, ca, n);
  m.synchronize();
};

struct host_memory {
  struct array {
    std::vector<std::byte> bytes;
    void* data() { return bytes.data(); }
    const void* data() const { return bytes.data(); }
  };
  array allocate(std::size_t n) { return {std::vector<std::byte>(n)}; }
  void upload(array& a, const void* src, std::size_t n) { std::memcpy(a.data(), src, n); }
  void download(void* dst, const array& a, std::size_t n) { std::memcpy(dst, a.data(), n); }
  void synchronize() {}
};

// The reference operation for one call: `call` (every rank calls it), timed in turn with ddp's
// forms; or, where it cannot run beside the ranks, `seconds` per call measured apart.
struct baseline {
  std::function<void()> call;
  double seconds = 0;
};
using baseline_fn = std::function<baseline(collective_kind, ddp::dtype, ddp::reduce_op, call_shape, void* send, void* recv)>;

// Runs the sweep on every rank of `comm`; `host` is a host-memory communicator over the same
// ranks for barriers and the timing reductions (it may be `comm` itself). Rank 0 fills `out`.
// Returns the elements the checks (-c) found wrong, summed over every row, form and rank: the
// same count on every rank.
template <class Comm, class Host, sweep_memory Memory>
long long run_sweep(Comm& comm, Host& host, Memory& mem, const collective_params& p, const baseline_fn& reference,
                    report& out) {
  const auto kind = parse_collective(p.collective);
  const int rank = comm.rank(), ranks = comm.size();
  const bool reduces = kind == collective_kind::all_reduce || kind == collective_kind::reduce_scatter;
  std::vector<ddp::reduce_op> ops = reduces ? parse_ops(p.ops) : std::vector<ddp::reduce_op>{ddp::reduce_op::sum};
  if (kind == collective_kind::broadcast && (p.root < 0 || p.root >= ranks))
    throw std::invalid_argument("root " + std::to_string(p.root) + " is not a rank of " + std::to_string(ranks));

  // Across ranks as -a asks (a host all_reduce of one double).
  auto across = [&](double v) {
    if (p.average == 0) {
      ddp::comm::broadcast(host, std::span<double>(&v, 1), 0);
      return v;
    }
    const auto op = p.average == 2 ? ddp::reduce_op::min : p.average == 3 ? ddp::reduce_op::max : ddp::reduce_op::sum;
    ddp::comm::all_reduce(host, std::span<double>(&v, 1), op);
    return p.average == 1 ? v / ranks : v;
  };
  // One rank: an in-place call's input is its output, so it moves nothing and its time is only
  // the call's overhead. Such a call is checked but not timed; its columns read n/a.
  const bool in_place_moves = ranks > 1;
  long long wrong_total = 0;

  for (const auto type : parse_dtypes(p.dtypes))
    for (const auto op : ops)
      for (const std::size_t bytes : sweep_sizes(p)) {
        const auto shape = shape_of(kind, bytes, type, ranks);
        if (shape.send == 0 && shape.recv == 0) continue;
        const std::size_t esize = ddp::size_of(type);
        auto send = mem.allocate(std::max<std::size_t>(shape.send, 1) * esize);
        auto recv = mem.allocate(std::max<std::size_t>(shape.recv, 1) * esize);
        const std::size_t part = kind == collective_kind::reduce_scatter ? shape.recv : shape.send;
        auto* send_bytes = static_cast<std::byte*>(send.data());
        auto* recv_bytes = static_cast<std::byte*>(recv.data());
        // The call's buffers: broadcast reads and writes `recv`.
        auto buffers = [&](bool in_place) -> std::pair<ddp::const_buffer, ddp::mutable_buffer> {
          switch (kind) {
            case collective_kind::all_reduce: {
              void* in = in_place ? recv.data() : send.data();
              return {{in, shape.send, type}, {recv.data(), shape.recv, type}};
            }
            case collective_kind::reduce_scatter: {
              void* to = in_place ? send_bytes + static_cast<std::size_t>(rank) * part * esize : recv.data();
              return {{send.data(), shape.send, type}, {to, shape.recv, type}};
            }
            case collective_kind::all_gather: {
              void* from = in_place ? recv_bytes + static_cast<std::size_t>(rank) * part * esize : send.data();
              return {{from, shape.send, type}, {recv.data(), shape.recv, type}};
            }
            case collective_kind::broadcast: break;
          }
          return {{recv.data(), shape.recv, type}, {recv.data(), shape.recv, type}};
        };
        // As a caller that wants the result uses it: the blocking form (ddp/comm/collectives.hpp).
        auto run = [&](bool in_place) {
          const auto [from, to] = buffers(in_place);
          switch (kind) {
            case collective_kind::all_reduce: ddp::comm::all_reduce(comm, from, to, op); break;
            case collective_kind::reduce_scatter: ddp::comm::reduce_scatter(comm, from, to, op); break;
            case collective_kind::all_gather: ddp::comm::all_gather(comm, from, to); break;
            case collective_kind::broadcast: ddp::comm::broadcast(comm, to, p.root); break;
          }
          mem.synchronize();
        };
        // As the trainer's buckets use it: the asynchronous member, its handle waited for.
        auto run_async = [&](bool in_place) {
          const auto [from, to] = buffers(in_place);
          switch (kind) {
            case collective_kind::all_reduce: comm.all_reduce(from, to, op).wait(); break;
            case collective_kind::reduce_scatter: comm.reduce_scatter(from, to, op).wait(); break;
            case collective_kind::all_gather: comm.all_gather(from, to).wait(); break;
            case collective_kind::broadcast: comm.broadcast(to, p.root).wait(); break;
          }
          mem.synchronize();
        };
        // Out of place, in place; broadcast has only the in-place form.
        const bool has_out_of_place = kind != collective_kind::broadcast;
        std::vector<std::byte> input(std::max(shape.send, shape.recv) * esize), output(shape.recv * esize);
        auto check = [&](bool in_place) -> long long {
          if (!p.check) return -1;
          // The input goes where the call reads it: send, or this rank's place in recv / send.
          if (kind == collective_kind::broadcast) {
            fill_input(type, input.data(), shape.recv, rank, 0);
            mem.upload(recv, input.data(), shape.recv * esize);
          } else if (kind == collective_kind::all_gather && in_place) {
            std::vector<std::byte> whole(shape.recv * esize);
            fill_input(type, whole.data() + static_cast<std::size_t>(rank) * part * esize, part, rank, 0);
            mem.upload(recv, whole.data(), whole.size());
          } else if (kind == collective_kind::all_reduce && in_place) {
            fill_input(type, input.data(), shape.recv, rank, 0);
            mem.upload(recv, input.data(), shape.recv * esize);
          } else {
            fill_input(type, input.data(), shape.send, rank, 0);
            mem.upload(send, input.data(), shape.send * esize);
          }
          mem.synchronize();
          run(in_place);
          if (kind == collective_kind::reduce_scatter && in_place) {
            std::vector<std::byte> whole(shape.send * esize);
            mem.download(whole.data(), send, whole.size());
            std::memcpy(output.data(), whole.data() + static_cast<std::size_t>(rank) * part * esize, output.size());
          } else {
            mem.download(output.data(), recv, output.size());
          }
          if (p.inject_wrong && rank == 0 && !output.empty()) output[0] = ~output[0];
          double wrong = static_cast<double>(count_wrong(kind, type, op, output.data(), shape.recv, rank, ranks, p.root));
          ddp::comm::all_reduce(host, std::span<double>(&wrong, 1), ddp::reduce_op::sum);
          return static_cast<long long>(wrong);
        };
        const double factor = bus_factor(kind, ranks);
        const std::size_t moved = std::max(shape.send, shape.recv) * esize;  // the size, cut to whole elements per rank
        const cell na{std::string("n/a")};
        // seconds < 0: not timed.
        auto columns = [&](double seconds, long long wrong) {
          const cell checked = wrong < 0 ? na : cell{wrong};
          if (seconds < 0) return std::vector<cell>{na, na, na, checked};
          const double algbw = static_cast<double>(moved) / seconds / 1e9;
          return std::vector<cell>{seconds * 1e6, algbw, algbw * factor, checked};
        };
        std::vector<cell> row{static_cast<long long>(moved), static_cast<long long>(std::max(shape.send, shape.recv)),
                              std::string(ddp::name_of(type)),
                              reduces ? std::string(ddp::name_of(op)) : std::string("none"),
                              kind == collective_kind::broadcast ? cell{static_cast<long long>(p.root)} : cell{-1LL}};
        const long long oop_wrong = has_out_of_place ? check(false) : -1, ip_wrong = check(true);
        wrong_total += std::max(oop_wrong, 0LL) + std::max(ip_wrong, 0LL);
        // Out of place, in place, the asynchronous form (in place for broadcast) and the baseline,
        // taking turns; a form that moves nothing (in place on one rank) is left out.
        const baseline base = reference(kind, type, op, shape, send.data(), recv.data());
        const bool async_in_place = !has_out_of_place, async_moves = !async_in_place || in_place_moves;
        std::vector<std::function<void()>> calls;
        auto timed = [&](bool when, std::function<void()> call) {
          if (!when) return -1;
          calls.push_back(std::move(call));
          return static_cast<int>(calls.size()) - 1;
        };
        const int oop_at = timed(has_out_of_place, [&] { run(false); }), ip_at = timed(in_place_moves, [&] { run(true); }),
                  async_at = timed(async_moves, [&] { run_async(async_in_place); }),
                  base_at = timed(static_cast<bool>(base.call), base.call);
        std::vector<double> seconds = best_seconds_per_call(p, calls, [&] { ddp::comm::barrier(host); });
        for (double& t : seconds) t = across(t);
        auto at = [&](int i) { return i < 0 ? -1.0 : seconds[static_cast<std::size_t>(i)]; };
        const double oop_seconds = at(oop_at), ip_seconds = at(ip_at), async_seconds = at(async_at),
                     base_seconds = base_at < 0 ? base.seconds : at(base_at);
        if (has_out_of_place) {
          const auto c = columns(oop_seconds, oop_wrong);
          row.insert(row.end(), c.begin(), c.end());
        } else {
          for (int i = 0; i < 4; ++i) row.push_back(na);
        }
        const auto c = columns(ip_seconds, ip_wrong);
        row.insert(row.end(), c.begin(), c.end());
        const double base_bw = static_cast<double>(moved) / base_seconds / 1e9 * (p.backend == "mpi" ? factor : 1.0);
        // ddp's busbw (of the out-of-place form; broadcast: the in-place one) over the baseline's.
        const auto vs_base = [&](double t) { return t < 0 ? na : cell{static_cast<double>(moved) / t / 1e9 * factor / base_bw}; };
        row.insert(row.end(), {base_seconds * 1e6, base_bw, vs_base(has_out_of_place ? oop_seconds : ip_seconds),
                               async_seconds < 0 ? na : cell{async_seconds * 1e6}, vs_base(async_seconds)});
        if (rank == 0) out.add(std::move(row));
      }
  return wrong_total;
}

// The note under a one-rank sweep's table: why its in-place columns read n/a.
inline std::string one_rank_note(const std::string& collective) {
  return std::string("1 rank: an in-place call moves nothing (its input is its output), so its time and bandwidth "
                     "read n/a") +
         (collective == "broadcast" ? " (broadcast has only that form: its asynchronous form too)" : "") +
         "; its result is still checked (ip_#wrong)";
}

// The exit status of a sweep that found `wrong` elements wrong: 0 when none, else 1, with a note
// under the table (kept in --out's file) and, from the rank that prints (`prints`), a line on
// stderr that says so.
inline int sweep_exit_status(long long wrong, report& out, bool prints) {
  if (wrong <= 0) return 0;
  const std::string text = "FAILED: " + std::to_string(wrong) +
                           " wrong element(s) in the checked results (the #wrong columns): the collective's results "
                           "are not what it must produce";
  if (prints) {
    out.note(text);
    std::fprintf(stderr, "ddp-bench: %s\n", text.c_str());
  }
  return 1;
}

}  // namespace bench
