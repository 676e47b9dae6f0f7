// ddp-bench collective: the sweep's arithmetic and checks, and its in-process and MPI backends.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "conformance/expected.hpp"
#include "ddp_bench/commands.hpp"
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

std::vector<column> collective_columns() {
  return {{"size(B)", 12, 0},      {"count", 11, 0},       {"type", 6, 0},          {"redop", 5, 0},
          {"root", 4, 0},          {"oop_time(us)", 12, 2}, {"oop_algbw", 9, 2},     {"oop_busbw", 9, 2},
          {"oop_#wrong", 10, 0},   {"ip_time(us)", 11, 2},  {"ip_algbw", 8, 2},      {"ip_busbw", 8, 2},
          {"ip_#wrong", 9, 0},     {"base_time(us)", 13, 2}, {"base_bw", 8, 2},       {"busbw/base", 10, 2},
          {"async_time(us)", 14, 2}, {"async/base", 10, 2}};
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
  if (ranks == 1) out.note(one_rank_note(p.collective));
}

report make_report(const collective_params& p, int ranks) {
  const std::string title = p.collective + " on " + p.backend + ", " + std::to_string(ranks) + " rank(s); time = best of " +
                            std::to_string(p.repeats) + " x " + std::to_string(p.iters) + " iterations, " +
                            (p.average == 0 ? "rank 0's" : p.average == 1 ? "mean over ranks" : p.average == 2 ? "min over ranks" : "max over ranks");
  return report("collective", title, collective_columns());
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
  long long wrong = 0;
  ddp::inproc::launch(
      p.ranks,
      [&](ddp::inproc::communicator& comm) {
        host_memory mem;
        const long long found = run_sweep(comm, comm, mem, p, baseline, out);  // the same on every rank
        if (comm.rank() == 0) wrong = found;
      },
      options);
  add_notes(out, p, p.ranks);
  if (!ceiling.empty()) out.note(ceiling);
  const int status = sweep_exit_status(wrong, out, true);
  out.write(p.out);
  return status;
}

#if DDP_BENCH_WITH_MPI
MPI_Datatype mpi_type(ddp::dtype t) { return ddp::mpi::datatype_of(t); }

int run_mpi(const collective_params& p) {
  if (!ddp::mpi::placement_from_environment())
    throw std::invalid_argument("--backend mpi runs one rank per process: start it with mpirun -np N (or srun)");
  ddp::mpi::environment env;
  ddp::mpi::communicator comm;
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
  const long long wrong = run_sweep(comm, comm, mem, p, baseline, out);  // every process fails alike
  if (comm.rank() == 0) add_notes(out, p, comm.size());
  const int status = sweep_exit_status(wrong, out, comm.rank() == 0);
  if (comm.rank() == 0) out.write(p.out);
  return status;
}
#endif

}  // namespace

int run_collective(const collective_params& p) {
  if (p.backend == "inproc") return run_inproc(p);
#if DDP_BENCH_WITH_MPI
  if (p.backend == "mpi") return run_mpi(p);
#else
  if (p.backend == "mpi")
    throw std::invalid_argument("this build has no MPI (OpenMPI was not found at configure time)");
#endif
  if (p.backend == "nccl") {
    report out = make_report(p, p.ranks);
    const long long wrong = run_collective_nccl(p, out);  // no_nccl.cpp outside the GPU build
    add_notes(out, p, p.ranks);
    const int status = sweep_exit_status(wrong, out, true);
    out.write(p.out);
    return status;
  }
  throw std::invalid_argument("no backend '" + p.backend + "'; choose inproc, mpi or nccl");
}

}  // namespace bench
