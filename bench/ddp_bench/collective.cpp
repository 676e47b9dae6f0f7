// ddp-bench collective: the sweep's arithmetic and checks, and its in-process and MPI backends.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "conformance/expected.hpp"
#include "ddp_bench/commands.hpp"
#include "ddp/host/device.hpp"
#include "ddp/inproc/launch.hpp"
#if DDP_BENCH_WITH_MPI
#include "ddp/mpi/communicator.hpp"
#endif

namespace bench {

collective_kind parse_collective(const std::string& name) {
  if (name == "all_reduce") return collective_kind::all_reduce;
  if (name == "reduce_scatter") return collective_kind::reduce_scatter;
  if (name == "all_gather") return collective_kind::all_gather;
  if (name == "broadcast") return collective_kind::broadcast;
  throw std::invalid_argument("no collective '" + name +
                              "'; choose all_reduce, reduce_scatter, all_gather or broadcast");
}

std::vector<std::size_t> sweep_sizes(const collective_params& p) {
  if (p.min_bytes > p.max_bytes)
    throw std::invalid_argument("-b " + std::to_string(p.min_bytes) + " is above -e " + std::to_string(p.max_bytes));
  if (p.step_factor <= 1 && p.step_bytes == 0 && p.min_bytes != p.max_bytes)
    throw std::invalid_argument("give -f above 1 or -i above 0 to step from -b to -e");
  std::vector<std::size_t> sizes;
  for (double b = static_cast<double>(p.min_bytes); b <= static_cast<double>(p.max_bytes);) {
    sizes.push_back(static_cast<std::size_t>(b));
    if (p.min_bytes == p.max_bytes) break;
    b = p.step_factor > 1 ? b * p.step_factor : b + static_cast<double>(p.step_bytes);
  }
  return sizes;
}

std::vector<ddp::dtype> parse_dtypes(const std::vector<std::string>& names) {
  static const std::map<std::string, ddp::dtype> known{
      {"float", ddp::dtype::f32}, {"f32", ddp::dtype::f32}, {"float32", ddp::dtype::f32},
      {"double", ddp::dtype::f64}, {"f64", ddp::dtype::f64}, {"float64", ddp::dtype::f64},
      {"int32", ddp::dtype::i32}, {"i32", ddp::dtype::i32}, {"int", ddp::dtype::i32},
      {"int64", ddp::dtype::i64}, {"i64", ddp::dtype::i64},
      {"uint8", ddp::dtype::u8}, {"u8", ddp::dtype::u8}};
  std::vector<ddp::dtype> types;
  for (const auto& n : names) {
    if (n == "all") return {ddp::dtype::f32, ddp::dtype::f64, ddp::dtype::i32, ddp::dtype::i64, ddp::dtype::u8};
    const auto it = known.find(n);
    if (it == known.end())
      throw std::invalid_argument("no dtype '" + n + "'; choose float, double, int32, int64, uint8 or all");
    types.push_back(it->second);
  }
  return types;
}

std::vector<ddp::reduce_op> parse_ops(const std::vector<std::string>& names) {
  std::vector<ddp::reduce_op> ops;
  for (const auto& n : names) {
    if (n == "all") return {ddp::reduce_op::sum, ddp::reduce_op::avg, ddp::reduce_op::min, ddp::reduce_op::max};
    if (n == "sum") ops.push_back(ddp::reduce_op::sum);
    else if (n == "avg") ops.push_back(ddp::reduce_op::avg);
    else if (n == "min") ops.push_back(ddp::reduce_op::min);
    else if (n == "max") ops.push_back(ddp::reduce_op::max);
    else throw std::invalid_argument("no reduction '" + n + "'; choose sum, avg, min, max or all");
  }
  return ops;
}

double bus_factor(collective_kind k, int ranks) {
  const double n = ranks;
  switch (k) {
    case collective_kind::all_reduce: return ranks > 1 ? 2 * (n - 1) / n : 1.0;
    case collective_kind::reduce_scatter:
    case collective_kind::all_gather: return ranks > 1 ? (n - 1) / n : 1.0;
    case collective_kind::broadcast: return 1.0;
  }
  return 1.0;
}

std::vector<column> collective_columns(const collective_params& p) {
  std::vector<column> c{{"size(B)", 12, 0},      {"count", 11, 0},       {"type", 6, 0},          {"redop", 5, 0},
                        {"root", 4, 0},          {"oop_time(us)", 12, 2}, {"oop_algbw", 9, 2},     {"oop_busbw", 9, 2},
                        {"oop_#wrong", 10, 0},   {"ip_time(us)", 11, 2},  {"ip_algbw", 8, 2},      {"ip_busbw", 8, 2},
                        {"ip_#wrong", 9, 0},     {"base_time(us)", 13, 2}, {"base_bw", 8, 2},       {"busbw/base", 10, 2},
                        {"async_time(us)", 14, 2}, {"async/base", 10, 2},
                        {"p50(us)", 9, 2},       {"p90(us)", 9, 2},       {"p99(us)", 9, 2},       {"max(us)", 9, 2},
                        {"cycle", 5, 0}};
  if (p.overlap)
    c.insert(c.end(), {{"ovl_comm(us)", 12, 2}, {"ovl_compute(us)", 15, 2}, {"ovl_total(us)", 13, 2},
                       {"overlap(%)", 10, 1}});
  if (p.memory) c.insert(c.end(), {{"host_hwm(MiB)", 13, 1}, {"dev_used(MiB)", 13, 1}});
  return c;
}

double host_rss_peak_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("VmHWM:")) return std::stod(line.substr(6)) * 1024;  // "VmHWM:   12345 kB"
  return 0;
}

call_shape shape_of(collective_kind k, std::size_t bytes, ddp::dtype t, int ranks) {
  const std::size_t total = bytes / ddp::size_of(t), w = static_cast<std::size_t>(ranks);
  switch (k) {
    case collective_kind::all_reduce: return {total, total};
    case collective_kind::broadcast: return {0, total};
    case collective_kind::reduce_scatter: return {total / w * w, total / w};
    case collective_kind::all_gather: return {total / w, total / w * w};
  }
  return {};
}

namespace {

template <class T>
bool same(T got, T want, ddp::reduce_op op, int ranks) {
  // NCCL's avg multiplies by 1/n before the sum: exact only at a power-of-two world.
  if constexpr (std::is_floating_point_v<T>)
    if (op == ddp::reduce_op::avg && (ranks & (ranks - 1)) != 0)
      return std::abs(got - want) <= 4 * std::numeric_limits<T>::epsilon() * std::abs(want);
  return got == want;
}

}  // namespace

void fill_input(ddp::dtype t, void* data, std::size_t count, int rank, std::size_t first_index) {
  ddp::visit_host_dtype(t, [&]<class T>(T) {
    auto* p = static_cast<T*>(data);
    for (std::size_t i = 0; i < count; ++i) p[i] = conformance::input<T>(rank, first_index + i);
  });
}

long long count_wrong(collective_kind k, ddp::dtype t, ddp::reduce_op op, const void* got, std::size_t count, int rank,
                      int ranks, int root) {
  return ddp::visit_host_dtype(t, [&]<class T>(T) {
    const auto* p = static_cast<const T*>(got);
    long long wrong = 0;
    const std::size_t part = k == collective_kind::all_gather ? count / static_cast<std::size_t>(ranks) : count;
    for (std::size_t i = 0; i < count; ++i) {
      T want{};
      switch (k) {
        case collective_kind::all_reduce: want = conformance::expected_reduction<T>(ranks, i, op); break;
        case collective_kind::reduce_scatter:
          want = conformance::expected_reduction<T>(ranks, static_cast<std::size_t>(rank) * count + i, op);
          break;
        case collective_kind::all_gather: want = conformance::input<T>(static_cast<int>(i / part), i % part); break;
        case collective_kind::broadcast: want = conformance::input<T>(root, i); break;
      }
      wrong += !same(p[i], want, op, ranks);
    }
    return wrong;
  });
}

namespace {

std::string baseline_note(const std::string& backend) {
  if (backend == "inproc")
    return "base: memcpy of the same bytes on one thread (base_bw = size / time); busbw/base = out-of-place busbw / it";
  if (backend == "mpi")
    return "base: the raw MPI collective on the same buffers (MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather, "
           "MPI_Bcast; base_bw is its busbw); busbw/base = ddp's out-of-place busbw / raw MPI's";
  return "base: cudaMemcpy device to device of the same bytes; busbw/base = out-of-place busbw / it";
}

void add_notes(report& out, const collective_params& p, int ranks) {
  out.note(baseline_note(p.backend));
  out.note("oop/ip: the blocking form (ddp::comm::all_reduce(comm, ...) and its siblings); async: the asynchronous member, "
           "its handle waited for (out of place; broadcast in place); async/base = its busbw / the baseline's");
  if (p.cuda_graph > 0)
    out.note("-G " + std::to_string(p.cuda_graph) + ": each batch of -n calls is one CUDA graph, launched " +
             std::to_string(p.cuda_graph) + " times; time = the launches' time / (-n x -G); p50..max read n/a");
  else if (p.blocking)
    out.note("-z 1: each call waited for before the next; p50/p90/p99/max: the times of single calls of the time "
             "column's form (out of place; broadcast in place), all " + std::to_string(p.repeats * p.iters) +
             " of every batch, across ranks as -a says");
  else
    out.note("-z 0: a batch of -n calls issued back to back and waited for once (the asynchronous form: every handle "
             "after the last call); p50..max read n/a");
  if (p.overlap)
    out.note("overlap: ovl_comm = the asynchronous form alone, ovl_compute = a busy loop of about that length alone, "
             "ovl_total = the collective started, the loop run, the collective waited for; overlap(%) = 100 (1 - "
             "(ovl_total - ovl_compute) / ovl_comm), within [0, 100]");
  if (p.memory)
    out.note("host_hwm: the largest resident-set high-water mark (VmHWM) of the ranks' processes so far; dev_used: the "
             "device memory in use on the busiest rank's GPU (n/a on host backends)");
  if (ranks == 1) out.note(one_rank_note(p.collective));
}

report make_report(const collective_params& p, int ranks) {
  const std::string title = p.collective + " on " + p.backend + ", " + std::to_string(ranks) + " rank(s); time = best of " +
                            std::to_string(p.repeats) + " x " + std::to_string(p.iters) + " iterations" +
                            (p.cycles > 1 ? " (" + std::to_string(p.cycles) + " cycles)" : std::string()) + ", " +
                            (p.average == 0 ? "rank 0's" : p.average == 1 ? "mean over ranks" : p.average == 2 ? "min over ranks" : "max over ranks");
  return report("collective", title, collective_columns(p));
}

// Seconds per memcpy of `bytes` on one thread; with `threads` > 1, each thread copying buffers of
// its own at the same moment (the slowest one's time): the memory bandwidth ranks share.
double memcpy_seconds(std::size_t bytes, int iterations, int threads = 1) {
  std::vector<std::vector<char>> from(static_cast<std::size_t>(threads)), to(from.size());
  for (std::size_t t = 0; t < from.size(); ++t) {
    from[t].assign(std::max<std::size_t>(bytes, 1), 1);
    to[t].assign(from[t].size(), 2);
  }
  auto copies = [&](std::size_t t) {
    for (int i = 0; i < iterations; ++i) {
      std::memcpy(to[t].data(), from[t].data(), bytes);
      asm volatile("" ::"r"(to[t].data()) : "memory");
    }
  };
  double best = 1e300;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = clock_type::now();
    std::vector<std::thread> others;
    for (std::size_t t = 1; t < from.size(); ++t) others.emplace_back(copies, t);
    copies(0);
    for (auto& o : others) o.join();
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - t0).count() / iterations);
  }
  return best;
}

int run_inproc(const collective_params& p) {
  report out = make_report(p, p.ranks);
  out.begin(true);
  // The baseline first, with no rank thread running beside it.
  std::map<std::size_t, double> memcpy_time;
  for (const auto type : parse_dtypes(p.dtypes))
    for (const auto bytes : sweep_sizes(p)) {
      const auto shape = shape_of(parse_collective(p.collective), bytes, type, p.ranks);
      const std::size_t b = std::max(shape.send, shape.recv) * ddp::size_of(type);
      if (!memcpy_time.count(b)) memcpy_time[b] = memcpy_seconds(b, std::max(p.iters, 5));
    }
  const baseline_fn baseline = [&](collective_kind, ddp::dtype type, ddp::reduce_op, call_shape shape, void*, void*) {
    return bench::baseline{.seconds = memcpy_time.at(std::max(shape.send, shape.recv) * ddp::size_of(type))};
  };
  // What the machine allows at the largest size: every rank's thread copying at once.
  std::string ceiling;
  if (p.ranks > 1 && !memcpy_time.empty()) {
    const auto [bytes, alone] = *memcpy_time.rbegin();
    const double slowdown = memcpy_seconds(bytes, std::max(p.iters, 5), p.ranks) / alone;
    char text[320];
    std::snprintf(text, sizeof text, "ceiling: %d threads each copying %zu bytes at once took %.2fx one thread's time",
                  p.ranks, bytes, slowdown);
    ceiling = text;
    if (parse_collective(p.collective) == collective_kind::all_reduce) {
      const double factor = bus_factor(collective_kind::all_reduce, p.ranks);
      std::snprintf(text, sizeof text,
                    "; an all_reduce moves a copy's bytes on every rank, so busbw/base at that size tops out near "
                    "%.2f / %.2f = %.2f",
                    factor, slowdown, factor / slowdown);
      ceiling += text;
    }
  }
  ddp::inproc::options options;
  options.bind_to_cores = p.bind;
  options.timeout = communicator_timeout(p, options.timeout);
  sweep_result found;
  ddp::inproc::launch(
      p.ranks,
      [&](ddp::inproc::communicator& comm) {
        host_memory mem;
        const sweep_result mine = run_sweep(comm, comm, mem, p, baseline, out);  // the same on every rank
        if (comm.rank() == 0) found = mine;
      },
      options);
  add_notes(out, p, p.ranks);
  if (!ceiling.empty()) out.note(ceiling);
  const int status = sweep_exit_status(found, out, true);
  out.write(p.out);
  return status;
}

#if DDP_BENCH_WITH_MPI
MPI_Datatype mpi_type(ddp::dtype t) { return ddp::mpi::datatype_of(t); }

int run_mpi(const collective_params& p) {
  if (!ddp::mpi::placement_from_environment())
    throw std::invalid_argument("--backend mpi runs one rank per process: start it with mpirun -np N (or srun)");
  ddp::mpi::environment env;
  ddp::mpi::options options;
  options.timeout = communicator_timeout(p, options.timeout);
  ddp::mpi::communicator comm(MPI_COMM_WORLD, options);
  report out = make_report(p, comm.size());
  out.begin(comm.rank() == 0);
  const baseline_fn baseline = [&](collective_kind k, ddp::dtype type, ddp::reduce_op op, call_shape shape, void* send,
                                   void* recv) {
    const MPI_Comm world = comm.native();
    const MPI_Op mop = op == ddp::reduce_op::min ? MPI_MIN : op == ddp::reduce_op::max ? MPI_MAX : MPI_SUM;
    const MPI_Datatype t = mpi_type(type);
    const int root = p.root;
    return bench::baseline{.call = [=] {
      switch (k) {
        case collective_kind::all_reduce:
          MPI_Allreduce(send, recv, static_cast<int>(shape.send), t, mop, world);
          break;
        case collective_kind::reduce_scatter:
          MPI_Reduce_scatter_block(send, recv, static_cast<int>(shape.recv), t, mop, world);
          break;
        case collective_kind::all_gather:
          MPI_Allgather(send, static_cast<int>(shape.send), t, recv, static_cast<int>(shape.send), t, world);
          break;
        case collective_kind::broadcast:
          MPI_Bcast(recv, static_cast<int>(shape.recv), t, root, world);
          break;
      }
    }};
  };
  host_memory mem;
  const sweep_result found = run_sweep(comm, comm, mem, p, baseline, out);  // every process fails alike
  if (comm.rank() == 0) add_notes(out, p, comm.size());
  const int status = sweep_exit_status(found, out, comm.rank() == 0);
  if (comm.rank() == 0) out.write(p.out);
  return status;
}
#endif

std::vector<column> bits_columns() {
  return {{"backend", 8, 0},   {"ranks", 5, 0}, {"reduction", 9, 0},   {"shards", 6, 0},
          {"elements", 10, 0}, {"hash", 16, 0}, {"ranks_agree", 11, 0}, {"same", 4, 0}};
}

std::string hex(std::uint64_t h) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// The verdict under the table: whether every row holds the same bits, and what that means under
// the reduction chosen. Returns the exit status.
int bits_verdict(const collective_params& p, const std::vector<bits_row>& rows, report& out) {
  std::vector<std::uint64_t> distinct;
  bool agree = true;
  std::string runs;  // "mpi at 2, inproc at 1, 2, 3"
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    if (std::find(distinct.begin(), distinct.end(), r.hash) == distinct.end()) distinct.push_back(r.hash);
    agree = agree && r.ranks_agree;
    const bool same_backend = i > 0 && rows[i - 1].backend == r.backend;
    runs += (i == 0 ? "" : ", ") + (same_backend ? std::string() : r.backend + " at ") + std::to_string(r.ranks);
  }
  const bool plain = p.reduction == "plain";
  if (distinct.size() == 1 && agree) {
    out.note("bits: identical: all " + std::to_string(rows.size()) + " results (" + runs + " ranks) read " +
             hex(distinct.front()) +
             (plain ? "; the plain reduction does not promise this (its sums happened to round alike here)" : ""));
    return 0;
  }
  std::string text = "bits: DIFFER: " + std::to_string(rows.size()) + " results (" + runs + " ranks) give " +
                     std::to_string(distinct.size()) + " distinct hashes" +
                     (agree ? "" : ", and the ranks of a run disagree (ranks_agree no)");
  text += plain ? "; expected under --reduction plain: a floating-point sum's bits depend on how the shards are spread "
                  "over the ranks and on the backend's order (--reduction invariant sums them exactly)"
                : "; reduction::invariant must give the same bits at every world size and over every backend";
  out.note(text);
  std::fprintf(stderr, "ddp-bench: FAILED: %s\n", text.c_str());
  return 1;
}

// The rows this process computes (in-process at every world size of --ranks; NCCL's in the GPU
// build), after `earlier` (MPI's), printed as they come, then the verdict.
int report_bits(const collective_params& p, std::size_t count, std::vector<bits_row> earlier) {
  report out("collective", "check bits: the average of " + std::to_string(p.shards) + " seeded shards of " +
                               std::to_string(count) + " floats (seed " + std::to_string(p.seed) + "), reduction " +
                               p.reduction + ", over every backend and world size",
             bits_columns());
  out.begin(true);
  std::vector<bits_row> rows;
  auto add = [&](const bits_row& r) {
    rows.push_back(r);
    out.add({r.backend, static_cast<long long>(r.ranks), p.reduction, static_cast<long long>(p.shards),
             static_cast<long long>(count), hex(r.hash), std::string(r.ranks_agree ? "yes" : "no"),
             std::string(r.hash == rows.front().hash ? "yes" : "no")});
  };
  for (const auto& r : earlier) add(r);
  for (const int n : p.rank_list) {
    bits_row row;
    ddp::inproc::launch(n, [&](ddp::inproc::communicator& comm) {
      ddp::host::device dev;
      const bits_row mine = reduce_seeded(comm, comm, dev, p, count);
      if (comm.rank() == 0) row = mine;
    });
    row.backend = "inproc";
    add(row);
  }
  std::vector<std::string> notes;
  for (auto& r : check_bits_nccl(p, count, notes)) add(r);
  for (const auto& n : notes) out.note(n);
  const int status = bits_verdict(p, rows, out);
  out.write(p.out);
  return status;
}

}  // namespace

int run_collective(const collective_params& p) {
  if (p.cuda_graph > 0 && p.backend != "nccl")
    throw std::invalid_argument("-G " + std::to_string(p.cuda_graph) + " launches through a CUDA graph, which only "
                                "--backend nccl has; drop -G for --backend " + p.backend);
  if (p.backend == "inproc") return run_inproc(p);
#if DDP_BENCH_WITH_MPI
  if (p.backend == "mpi") return run_mpi(p);
#else
  if (p.backend == "mpi")
    throw std::invalid_argument("this build has no MPI (OpenMPI was not found at configure time)");
#endif
  if (p.backend == "nccl") {
    report out = make_report(p, p.ranks);
    const sweep_result found = run_collective_nccl(p, out);  // no_nccl.cpp outside the GPU build
    add_notes(out, p, p.ranks);
    const int status = sweep_exit_status(found, out, true);
    out.write(p.out);
    return status;
  }
  throw std::invalid_argument("no backend '" + p.backend + "'; choose inproc, mpi or nccl");
}

int run_check_bits(const collective_params& p) {
  if (p.collective != "all_reduce")
    throw std::invalid_argument("--check bits reduces with all_reduce, as the trainer reduces gradients; drop '" +
                                p.collective + "'");
  for (const int n : p.rank_list)
    if (n < 1 || static_cast<std::size_t>(n) > p.shards)
      throw std::invalid_argument("--ranks " + std::to_string(n) + ": --check bits deals " + std::to_string(p.shards) +
                                  " shards, one at least per rank; give --shards " + std::to_string(n) +
                                  " or more, or fewer ranks");
  const std::size_t count = std::max<std::size_t>(1, p.max_bytes / sizeof(float));
#if DDP_BENCH_WITH_MPI
  if (ddp::mpi::placement_from_environment()) {
    ddp::mpi::environment env;
    ddp::mpi::communicator comm;
    if (static_cast<std::size_t>(comm.size()) > p.shards)
      throw std::invalid_argument("mpirun -np " + std::to_string(comm.size()) + " is more than --shards " +
                                  std::to_string(p.shards) + "; give --shards " + std::to_string(comm.size()));
    ddp::host::device dev;
    bits_row row = reduce_seeded(comm, comm, dev, p, count);
    row.backend = "mpi";
    double status = 0;
    if (comm.rank() == 0) {
      try {
        status = report_bits(p, count, {row});
      } catch (const std::exception& e) {
        comm.abort(std::string("--check bits failed on rank 0: ") + e.what());  // the others wait in broadcast
        throw;
      }
    }
    ddp::comm::broadcast(comm, std::span<double>(&status, 1), 0);  // every process exits alike
    return static_cast<int>(status);
  }
#endif
  return report_bits(p, count, {});
}

}  // namespace bench
