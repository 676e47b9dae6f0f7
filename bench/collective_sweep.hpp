#pragma once
// ddp-bench collective: an nccl-tests-style sweep of one collective over any communicator. For
// every size, dtype and reduction: time, algbw and busbw out of place and in place (the blocking
// form a caller that wants the result uses), the number of wrong elements (-c), a baseline
// measured in the same run beside them, and the asynchronous form (issued, then waited for);
// then the tail of single calls' times (P50, P90, P99, max), the cycle (-N), and on request the
// overlap of the asynchronous form with a compute period (--overlap) and memory in use (-M).
// Sizes mean what nccl-tests means: the bytes of the whole buffer (all_reduce and broadcast: the buffer;
// reduce_scatter: the input of all ranks' parts; all_gather: the output), and busbw = algbw x
// the collective's factor: all_reduce 2(n-1)/n, reduce_scatter and all_gather (n-1)/n,
// broadcast 1. A wrong element, or a size that runs past -T, fails the run: run_sweep returns
// what it found and sweep_exit_status turns that into the exit status. On one rank an in-place call has nothing to
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
  int blocking = 1;              // -z: 1 each call waited for before the next; 0 a batch issued, then waited once
  int cuda_graph = 0;            // -G: > 0 captures a batch into a CUDA graph, launched this many times (nccl)
  int cycles = 1;                // -N: the whole sweep this many times
  double timeout = 0;            // -T: seconds a size may take (0: no limit); also the communicator's timeout
  bool memory = false;           // -M: host RSS high-water mark and device memory used, per size
  bool overlap = false;          // --overlap: the share of a compute period the asynchronous form hides
  bool check_bits = false;       // --check bits: seeded inputs over every backend and world size, bits compared
  std::vector<int> rank_list{1, 2, 3, 4};  // --check bits: the world sizes
  std::string reduction = "invariant";     // --check bits: invariant (exact sums) or plain (floating point)
  std::size_t shards = 8;                  // --check bits: the virtual shards the inputs are dealt as
  std::uint64_t seed = 1;                  // --check bits: the inputs' seed
  std::string out;
};

// The per-size time limit (-T) as the communicators' own timeout, so that a collective a peer
// never joins fails every rank instead of hanging: -T, but at least a second (a peer that the
// scheduler set aside for a moment is not a failure); `fallback` without -T.
inline std::chrono::milliseconds communicator_timeout(const collective_params& p, std::chrono::milliseconds fallback) {
  if (p.timeout <= 0) return fallback;
  return std::chrono::milliseconds(std::max<long long>(1000, static_cast<long long>(std::ceil(p.timeout * 1000))));
}

// One way of calling the collective, timed in turn with the others. `issue` makes one call and
// orders its result after it (host backends: the result is in place; a GPU: the compute stream
// waits for it); the sweep synchronises the memory after it (-z 1) or after a batch (-z 0).
// `issue_batch`, where given, issues n calls back to back and only then waits for them all (the
// asynchronous member's handles), as -z 0 means for a form that returns a handle.
struct timed_form {
  std::function<void()> issue;
  std::function<void(int)> issue_batch;
};

// What the timing of one form found: the best batch's mean time per call, and (-z 1, no graph)
// every timed call's own time, in order, over all batches.
struct form_times {
  double best = 1e300;
  std::vector<double> samples;
};

// A size that ran past -T: every rank learns it at the same point (sweep_clock::agree) and stops.
struct size_timeout : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Where a size's time began, and the one place the ranks agree on whether it ran past -T: a
// reduction of one flag over the host communicator, which is also the barrier each timed batch
// starts from. `agree` throws size_timeout on every rank at once.
template <class Host>
class sweep_clock {
 public:
  sweep_clock(Host& host, double limit_seconds) : host_(&host), limit_(limit_seconds) {}
  void restart() { began_ = clock_type::now(); }
  double elapsed() const { return std::chrono::duration<double>(clock_type::now() - began_).count(); }
  void agree() {
    double late = limit_ > 0 && elapsed() > limit_ ? 1.0 : 0.0;
    ddp::comm::all_reduce(*host_, std::span<double>(&late, 1), ddp::reduce_op::max);
    if (late > 0) throw size_timeout("ran past -T " + std::to_string(limit_) + " s");
  }

 private:
  Host* host_;
  double limit_;
  clock_type::time_point began_ = clock_type::now();
};

// Memory that can capture a batch of calls into a CUDA graph (the GPU build's device memory):
// capture(issue, calls, launches) returns a function that launches the graph `launches` times
// and waits for the device.
template <class M>
concept graph_memory = requires(M& m, const std::function<void()>& issue) {
  { m.capture(issue, 1, 1) } -> std::convertible_to<std::function<void()>>;
};
// Memory that can say how many bytes of its device are in use (-M).
template <class M>
concept reporting_memory = requires(M& m) {
  { m.device_used_bytes() } -> std::convertible_to<double>;
};

// Seconds per call of each form: `p.warmup` untimed calls of each, then `p.repeats` rounds in
// which each form in turn runs a batch of `p.iters` after `start()` (which the ranks pass
// together); each form's best batch (a shared machine's least disturbed) is kept. The forms take
// turns batch by batch, so a ratio between them compares the same moments of the machine, not
// whichever ran first. -z 1: every call is timed on its own (form_times::samples); -z 0: a batch
// is issued back to back and waited for once; -G N: the batch is one CUDA graph launched N times.
template <class Memory>
std::vector<form_times> time_forms(const collective_params& p, const std::vector<timed_form>& forms, Memory& mem,
                                   const std::function<void()>& start) {
  for (const auto& f : forms) {
    for (int i = 0; i < p.warmup; ++i) f.issue();
    mem.synchronize();
  }
  std::vector<std::function<void()>> graphs;
  if constexpr (graph_memory<Memory>)
    if (p.cuda_graph > 0)
      for (const auto& f : forms) graphs.push_back(mem.capture(f.issue, p.iters, p.cuda_graph));
  std::vector<form_times> times(forms.size());
  if (p.blocking && graphs.empty())
    for (auto& t : times) t.samples.reserve(static_cast<std::size_t>(p.repeats) * static_cast<std::size_t>(p.iters));
  std::vector<clock_type::time_point> stamps(static_cast<std::size_t>(p.iters) + 1);
  for (int r = 0; r < p.repeats; ++r)
    for (std::size_t c = 0; c < forms.size(); ++c) {
      start();
      double calls = p.iters;
      stamps[0] = clock_type::now();
      if (!graphs.empty()) {
        graphs[c]();
        calls *= p.cuda_graph;
      } else if (p.blocking) {
        for (std::size_t i = 1; i < stamps.size(); ++i) {
          forms[c].issue();
          mem.synchronize();
          stamps[i] = clock_type::now();
          times[c].samples.push_back(std::chrono::duration<double>(stamps[i] - stamps[i - 1]).count());
        }
      } else if (forms[c].issue_batch) {
        forms[c].issue_batch(p.iters);
        mem.synchronize();
      } else {
        for (int i = 0; i < p.iters; ++i) forms[c].issue();
        mem.synchronize();
      }
      // -z 1: the calls' own times add up to the batch's (so the mean is never above the largest).
      const auto end = !graphs.empty() || !p.blocking ? clock_type::now() : stamps.back();
      const double mean = std::chrono::duration<double>(end - stamps[0]).count() / calls;
      times[c].best = std::min(times[c].best, mean);
    }
  return times;
}

// A compute period of `units` dependent multiply-adds on the calling thread (OSU's dummy compute),
// and the units that take about `seconds` on this thread.
inline void busy_compute(std::uint64_t units) {
  std::uint64_t x = units;
  for (std::uint64_t u = 0; u < units; ++u) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    asm volatile("" : "+r"(x));
  }
}
inline std::uint64_t busy_units_for(double seconds) {
  constexpr std::uint64_t probe = 1 << 16;
  double best = 1e300;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = clock_type::now();
    busy_compute(probe);
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(seconds / best * probe));
}

// OSU's overlap: the share of the collective's time (t_comm, alone) hidden behind a compute
// period (t_compute, alone) when the collective is started first and waited for after it
// (t_total): 100 (1 - (t_total - t_compute) / t_comm), within [0, 100].
inline double overlap_percent(double t_comm, double t_compute, double t_total) {
  if (!(t_comm > 0)) return 0;
  return std::clamp(100.0 * (1.0 - (t_total - t_compute) / t_comm), 0.0, 100.0);
}

// The tail columns from single calls' times (seconds): P50, P90, P99 and the largest, in
// microseconds; n/a each when there are none (-z 0, -G, a form not timed).
inline std::vector<cell> tail_cells(const std::vector<double>& seconds) {
  if (seconds.empty()) return std::vector<cell>(4, cell{std::string("n/a")});
  return {percentile(seconds, 50) * 1e6, percentile(seconds, 90) * 1e6, percentile(seconds, 99) * 1e6,
          percentile(seconds, 100) * 1e6};
}

// The overlap columns of one size: t_comm (the asynchronous form alone, as timed beside the other
// forms; < 0 when it was not), a compute period of about that length timed alone (t_compute), and
// both, the collective started (`start_async()`, a work handle) before the compute and waited for
// after it (t_total); every call waited for on its own, whatever -z says. `across` combines a
// time over the ranks as -a says, `agree` starts each batch (sweep_clock::agree).
template <class Memory, class StartAsync, class Across>
std::vector<cell> overlap_cells(const collective_params& p, Memory& mem, double t_comm, StartAsync start_async,
                                Across across, const std::function<void()>& agree) {
  if (t_comm <= 0) return std::vector<cell>(4, cell{std::string("n/a")});
  const std::uint64_t units = busy_units_for(t_comm);
  collective_params each = p;
  each.blocking = 1;
  each.cuda_graph = 0;
  const std::vector<timed_form> forms{{[&] { busy_compute(units); }, {}},
                                      {[&] {
                                         auto work = start_async();
                                         busy_compute(units);
                                         work.wait();
                                       },
                                       {}}};
  const auto t = time_forms(each, forms, mem, agree);
  const double t_compute = across(t[0].best), t_total = across(t[1].best);
  return {t_comm * 1e6, t_compute * 1e6, t_total * 1e6, overlap_percent(t_comm, t_compute, t_total)};
}

// The process's resident-set high-water mark (VmHWM), in bytes; 0 where /proc does not say.
double host_rss_peak_bytes();

collective_kind parse_collective(const std::string& name);
std::vector<std::size_t> sweep_sizes(const collective_params& p);
std::vector<ddp::dtype> parse_dtypes(const std::vector<std::string>& names);
std::vector<ddp::reduce_op> parse_ops(const std::vector<std::string>& names);
double bus_factor(collective_kind k, int ranks);
std::vector<column> collective_columns(const collective_params& p);

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
  std::function<void()> call{};
  double seconds = 0;
};
using baseline_fn = std::function<baseline(collective_kind, ddp::dtype, ddp::reduce_op, call_shape, void* send, void* recv)>;

// What a sweep found, the same on every rank: the elements the checks (-c) found wrong, summed
// over every row, form and rank; and the size that ran past -T, if one did (the sweep stops there).
struct sweep_result {
  long long wrong = 0;
  std::string timed_out;
};

// Runs the sweep (-N times) on every rank of `comm`; `host` is a host-memory communicator over
// the same ranks for barriers and the timing reductions (it may be `comm` itself). Rank 0 fills
// `out`.
template <class Comm, class Host, sweep_memory Memory>
sweep_result run_sweep(Comm& comm, Host& host, Memory& mem, const collective_params& p, const baseline_fn& reference,
                       report& out) {
  const auto kind = parse_collective(p.collective);
  const int rank = comm.rank(), ranks = comm.size();
  const bool reduces = kind == collective_kind::all_reduce || kind == collective_kind::reduce_scatter;
  std::vector<ddp::reduce_op> ops = reduces ? parse_ops(p.ops) : std::vector<ddp::reduce_op>{ddp::reduce_op::sum};
  if (kind == collective_kind::broadcast && (p.root < 0 || p.root >= ranks))
    throw std::invalid_argument("root " + std::to_string(p.root) + " is not a rank of " + std::to_string(ranks));

  // Across ranks as -a asks (a host all_reduce of the values, element by element).
  auto across_each = [&](std::vector<double> v) {
    if (v.empty()) return v;
    const std::span<double> all(v);
    if (p.average == 0) {
      ddp::comm::broadcast(host, all, 0);
      return v;
    }
    const auto op = p.average == 2 ? ddp::reduce_op::min : p.average == 3 ? ddp::reduce_op::max : ddp::reduce_op::sum;
    ddp::comm::all_reduce(host, all, op);
    if (p.average == 1)
      for (double& x : v) x /= ranks;
    return v;
  };
  auto across = [&](double v) { return across_each({v}).front(); };
  auto largest = [&](double v) {
    ddp::comm::all_reduce(host, std::span<double>(&v, 1), ddp::reduce_op::max);
    return v;
  };
  // One rank: an in-place call's input is its output, so it moves nothing and its time is only
  // the call's overhead. Such a call is checked but not timed; its columns read n/a.
  const bool in_place_moves = ranks > 1;
  sweep_clock<Host> clock(host, p.timeout);
  sweep_result result;
  std::string current;  // the size being measured, for a -T report

  try {
    for (int cycle = 1; cycle <= p.cycles; ++cycle)
      for (const auto type : parse_dtypes(p.dtypes))
        for (const auto op : ops)
          for (const std::size_t bytes : sweep_sizes(p)) {
            const auto shape = shape_of(kind, bytes, type, ranks);
            if (shape.send == 0 && shape.recv == 0) continue;
            clock.restart();
            const std::size_t esize = ddp::size_of(type);
            current = "size " + std::to_string(std::max(shape.send, shape.recv) * esize) + " B (" +
                      std::string(ddp::name_of(type)) + (reduces ? ", " + std::string(ddp::name_of(op)) : "") +
                      (p.cycles > 1 ? ", cycle " + std::to_string(cycle) : "") + ")";
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
            auto issue = [&](bool in_place) {
              const auto [from, to] = buffers(in_place);
              switch (kind) {
                case collective_kind::all_reduce: ddp::comm::all_reduce(comm, from, to, op); break;
                case collective_kind::reduce_scatter: ddp::comm::reduce_scatter(comm, from, to, op); break;
                case collective_kind::all_gather: ddp::comm::all_gather(comm, from, to); break;
                case collective_kind::broadcast: ddp::comm::broadcast(comm, to, p.root); break;
              }
            };
            auto run = [&](bool in_place) {
              issue(in_place);
              mem.synchronize();
            };
            // As the trainer's buckets use it: the asynchronous member, which returns a handle.
            using work = decltype(comm.all_reduce(ddp::const_buffer{}, ddp::mutable_buffer{}, op));
            auto start_async = [&](bool in_place) -> work {
              const auto [from, to] = buffers(in_place);
              switch (kind) {
                case collective_kind::all_reduce: return comm.all_reduce(from, to, op);
                case collective_kind::reduce_scatter: return comm.reduce_scatter(from, to, op);
                case collective_kind::all_gather: return comm.all_gather(from, to);
                case collective_kind::broadcast: break;
              }
              return comm.broadcast(to, p.root);
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
            result.wrong += std::max(oop_wrong, 0LL) + std::max(ip_wrong, 0LL);
            // Out of place, in place, the asynchronous form (in place for broadcast) and the baseline,
            // taking turns; a form that moves nothing (in place on one rank) is left out.
            const baseline base = reference(kind, type, op, shape, send.data(), recv.data());
            const bool async_in_place = !has_out_of_place, async_moves = !async_in_place || in_place_moves;
            std::vector<timed_form> forms;
            auto timed = [&](bool when, timed_form form) {
              if (!when) return -1;
              forms.push_back(std::move(form));
              return static_cast<int>(forms.size()) - 1;
            };
            const auto async_batch = [&](int n) {
              std::vector<work> pending;
              pending.reserve(static_cast<std::size_t>(n));
              for (int i = 0; i < n; ++i) pending.push_back(start_async(async_in_place));
              for (auto& w : pending) w.wait();
            };
            const int oop_at = timed(has_out_of_place, {[&] { issue(false); }, {}}),
                      ip_at = timed(in_place_moves, {[&] { issue(true); }, {}}),
                      async_at = timed(async_moves, {[&] { start_async(async_in_place).wait(); }, async_batch}),
                      base_at = timed(static_cast<bool>(base.call), {base.call, {}});
            const auto agree = [&] { clock.agree(); };
            const std::vector<form_times> times = time_forms(p, forms, mem, agree);
            auto at = [&](int i) { return i < 0 ? -1.0 : across(times[static_cast<std::size_t>(i)].best); };
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
            // The tail of the time column's form (out of place; broadcast: in place): each call's own
            // time (-a across ranks, call by call); n/a where calls are not timed one by one.
            const int tail_at = has_out_of_place ? oop_at : ip_at;
            const auto tail = tail_cells(tail_at < 0 ? std::vector<double>{}
                                                     : across_each(times[static_cast<std::size_t>(tail_at)].samples));
            row.insert(row.end(), tail.begin(), tail.end());
            row.push_back(static_cast<long long>(cycle));
            if (p.overlap) {
              const auto overlap = overlap_cells(p, mem, async_seconds, [&] { return start_async(async_in_place); },
                                                 across, agree);
              row.insert(row.end(), overlap.begin(), overlap.end());
            }
            clock.agree();  // the size's last batch may have run past -T too
            if (p.memory) {
              row.push_back(largest(host_rss_peak_bytes()) / (1 << 20));
              if constexpr (reporting_memory<Memory>) row.push_back(largest(mem.device_used_bytes()) / (1 << 20));
              else row.push_back(na);
            }
            if (rank == 0) out.add(std::move(row));
          }
  } catch (const size_timeout& e) {
    result.timed_out = current + " " + e.what();
  }
  return result;
}

// The note under a one-rank sweep's table: why its in-place columns read n/a.
inline std::string one_rank_note(const std::string& collective) {
  return std::string("1 rank: an in-place call moves nothing (its input is its output), so its time and bandwidth "
                     "read n/a") +
         (collective == "broadcast" ? " (broadcast has only that form: its asynchronous form too)" : "") +
         "; its result is still checked (ip_#wrong)";
}

// The exit status of a sweep: 0 when its checks found no wrong element and no size ran past -T,
// else 1, with a note under the table (kept in --out's file) and, from the rank that prints
// (`prints`), a line on stderr for each.
inline int sweep_exit_status(const sweep_result& r, report& out, bool prints) {
  std::vector<std::string> failures;
  if (r.wrong > 0)
    failures.push_back("FAILED: " + std::to_string(r.wrong) +
                       " wrong element(s) in the checked results (the #wrong columns): the collective's results "
                       "are not what it must produce");
  if (!r.timed_out.empty())
    failures.push_back("TIMEOUT: " + r.timed_out + "; the sweep stopped there (raise -T, or give smaller sizes)");
  if (prints)
    for (const auto& text : failures) {
      out.note(text);
      std::fprintf(stderr, "ddp-bench: %s\n", text.c_str());
    }
  return failures.empty() ? 0 : 1;
}

}  // namespace bench
