#pragma once
// The MPI communicator (OpenMPI): one rank per process, host memory, for one or many machines.
// Collectives run on a progress thread in issue order, so the asynchronous forms overlap the
// caller's compute (the trainer's bucket reductions overlap backward).
//
// MPI has no timeouts and does not tell peers that a rank died. ddp adds both:
//   - a watchdog ends the job (MPI_Abort) when one collective runs longer than the timeout,
//     after printing which collective, its sequence number, the rank that gave up and, from a
//     roll call of every rank (each watchdog answers on a communicator of its own), the ranks
//     that never arrived and where they are;
//   - abort(reason) prints the reason and ends the job; mpirun then stops every rank.
// A rank that throws out of main ends its process, and mpirun stops the others as well.
// Under ddp-run (docs/elastic.md) a dead peer is reported by ddp-run instead: every pending and
// later collective fails with ddp::peer_error at once, and abort() tells ddp-run rather than
// ending the job, so that the trainers can hand their state over to the next membership.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/comm/progress_thread.hpp"
#include "ddp/comm/watchdog.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/host/kernels.hpp"
#include "ddp/mpi/check.hpp"
#include "ddp/mpi/environment.hpp"
#include "ddp/comm/run_agent.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::mpi {

struct options {
  // A collective that runs longer than this ends the job with a message naming it.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // The flight recorder (comm/flight_recorder.hpp; unset: DDP_FLIGHT_RECORDER_* or the defaults).
  std::optional<comm::recorder_options> recorder;
};

inline MPI_Datatype datatype_of(dtype t) {
  switch (t) {
    case dtype::f32: return MPI_FLOAT;
    case dtype::f64: return MPI_DOUBLE;
    case dtype::i32: return MPI_INT32_T;
    case dtype::i64: return MPI_INT64_T;
    case dtype::u8: return MPI_UINT8_T;
    case dtype::f16: case dtype::bf16: return MPI_UINT16_T;  // reduced by half_ops, never by MPI's own
  }
  throw error("mpi", "datatype", -1, "dtype " + std::string(name_of(t)) + " has no MPI datatype here");
}

// MPI has no 16-bit floating types: f16 and bf16 travel as MPI_UINT16_T and are reduced by
// operations of ours, which widen each pair to f32, combine and round once.
class half_ops {
 public:
  half_ops() {
    create<host::bf16_format>(bf16_);
    create<host::f16_format>(f16_);
  }
  half_ops(const half_ops&) = delete;
  half_ops& operator=(const half_ops&) = delete;
  ~half_ops() {
    for (auto* ops : {&bf16_, &f16_})
      for (MPI_Op& op : *ops) MPI_Op_free(&op);
  }
  MPI_Op get(dtype t, reduce_op op) const {
    const auto& ops = t == dtype::bf16 ? bf16_ : f16_;
    switch (op) {
      case reduce_op::min: return ops[1];
      case reduce_op::max: return ops[2];
      default: return ops[0];  // sum, and avg (divided by the caller)
    }
  }

 private:
  template <class Format, reduce_op Op>
  static void combine(void* in, void* inout, int* len, MPI_Datatype*) {
    const auto* a = static_cast<const std::uint16_t*>(in);
    auto* b = static_cast<std::uint16_t*>(inout);
    for (int i = 0; i < *len; ++i) {
      const float x = Format::from(a[i]), y = Format::from(b[i]);
      const float r = Op == reduce_op::min ? (x < y ? x : y) : Op == reduce_op::max ? (x > y ? x : y) : x + y;
      b[i] = Format::to(r);
    }
  }
  template <class Format>
  static void create(std::array<MPI_Op, 3>& ops) {
    MPI_Op_create(&combine<Format, reduce_op::sum>, 1, &ops[0]);
    MPI_Op_create(&combine<Format, reduce_op::min>, 1, &ops[1]);
    MPI_Op_create(&combine<Format, reduce_op::max>, 1, &ops[2]);
  }
  std::array<MPI_Op, 3> bf16_{}, f16_{};
};

inline MPI_Op op_of(reduce_op op) {
  switch (op) {
    case reduce_op::sum: case reduce_op::avg: return MPI_SUM;  // avg: see communicator::all_reduce
    case reduce_op::min: return MPI_MIN;
    case reduce_op::max: return MPI_MAX;
  }
  return MPI_SUM;
}

class communicator {
 public:
  static constexpr device_kind memory_kind = device_kind::cpu;
  static constexpr std::string_view backend_name = "mpi";

  // Duplicates `parent`, so ddp's traffic never matches the application's own messages.
  explicit communicator(MPI_Comm parent = MPI_COMM_WORLD, options opts = {});
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;

  ~communicator();

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  // This process's index on its machine (mpirun's OMPI_COMM_WORLD_LOCAL_RANK, Slurm's
  // SLURM_LOCALID): the GPU a rank binds.
  int local_rank() const noexcept { return local_rank_; }
  MPI_Comm native() const noexcept { return comm_; }

  // avg of floating-point data keeps a finite average finite (two ranks at 2^127 average to
  // 2^127, not inf) and otherwise has the bits of sum-then-divide, as the in-process backend: at
  // a power-of-two world each rank's contribution is divided before the sum (exact, so the same
  // bits); at any other world the sum is divided, and an element whose sum overflowed is summed
  // again from divided contributions (average_after_sum). Integers sum, then divide. f16 and bf16
  // (half_ops) divide every contribution first, then sum, rounding to 16 bits at each step.
  template <issue_mode How = asynchronous_t>
  auto all_reduce(const_buffer send, mutable_buffer recv, reduce_op op, How how = How{}) {
    return issue(how, "all_reduce", send.count, send.type, op, -1, [=, this](const char* name) {
      require(recv.count == send.count && recv.type == send.type, name, "recv must have the count and dtype of send");
      const int n = count(send.count, name);
      const auto sum = [&](const void* in, void* out) {
        check(MPI_Allreduce(in, out, n, datatype_of(send.type), op_for(send.type, reduce_op::sum), comm_), name, rank_);
      };
      if (op == reduce_op::avg && is_floating(send.type)) {
        if (divides_first(send.type)) {
          if (send.data != recv.data) std::memcpy(recv.data, send.data, send.bytes());
          divide(recv);
          sum(MPI_IN_PLACE, recv.data);
        } else {
          const_buffer input = send;
          if (send.data == recv.data) input.data = keep(send);  // the sum overwrites it
          average_after_sum(input, recv, sum);
        }
        return;
      }
      const void* in = send.data == recv.data ? MPI_IN_PLACE : send.data;
      check(MPI_Allreduce(in, recv.data, n, datatype_of(send.type), op_for(send.type, op), comm_), name, rank_);
      if (op == reduce_op::avg) divide(recv);  // integers: sum, then divide
    });
  }

  template <issue_mode How = asynchronous_t>
  auto broadcast(mutable_buffer buf, int root, How how = How{}) {
    return issue(how, "broadcast", buf.count, buf.type, reduce_op::sum, root, [=, this](const char* name) {
      require_root(root, name);
      check(MPI_Bcast(buf.data, count(buf.count, name), datatype_of(buf.type), root, comm_), name, rank_);
    });
  }

  template <issue_mode How = asynchronous_t>
  auto all_gather(const_buffer send, mutable_buffer recv, How how = How{}) {
    return issue(how, "all_gather", send.count, send.type, reduce_op::sum, -1, [=, this](const char* name) {
      require(recv.count == send.count * static_cast<std::size_t>(size_) && recv.type == send.type, name,
              "recv must hold size() * send.count elements of send's dtype");
      const auto* own = static_cast<const char*>(recv.data) + static_cast<std::size_t>(rank_) * send.bytes();
      const void* in = send.data == own ? MPI_IN_PLACE : send.data;
      const int n = count(send.count, name);
      check(MPI_Allgather(in, n, datatype_of(send.type), recv.data, n, datatype_of(send.type), comm_), name, rank_);
    });
  }

  template <issue_mode How = asynchronous_t>
  auto reduce_scatter(const_buffer send, mutable_buffer recv, reduce_op op, How how = How{}) {
    return issue(how, "reduce_scatter", recv.count, send.type, op, -1, [=, this](const char* name) {
      require(send.count == recv.count * static_cast<std::size_t>(size_) && recv.type == send.type, name,
              "send must hold size() * recv.count elements of recv's dtype");
      // MPI's in-place form differs from ours (recv inside send): reduce into scratch then.
      const auto* own = static_cast<const char*>(send.data) + static_cast<std::size_t>(rank_) * recv.bytes();
      const bool in_place = own == recv.data && recv.count > 0;
      if (in_place && scratch_.size() < recv.bytes()) scratch_.resize(recv.bytes());
      const mutable_buffer out{in_place ? scratch_.data() : recv.data, recv.count, recv.type};
      const int n = count(recv.count, name);
      const auto sum = [&](const void* in, void* to) {
        check(MPI_Reduce_scatter_block(in, to, n, datatype_of(send.type), op_for(send.type, reduce_op::sum), comm_), name,
              rank_);
      };
      if (op == reduce_op::avg && is_floating(send.type)) {  // as all_reduce
        if (divides_first(send.type)) {
          sum(divided(send), out.data);
        } else {
          average_after_sum(send, out, sum);
        }
      } else {
        check(MPI_Reduce_scatter_block(send.data, out.data, n, datatype_of(send.type), op_for(send.type, op), comm_), name,
              rank_);
        if (op == reduce_op::avg) divide(out);
      }
      if (in_place) std::memcpy(recv.data, scratch_.data(), recv.bytes());
    });
  }

  template <issue_mode How = asynchronous_t>
  auto barrier(How how = How{}) {
    return issue(how, "barrier", 0, dtype::u8, reduce_op::sum, -1, [this](const char* name) { check(MPI_Barrier(comm_), name, rank_); });
  }

  // Ends the job: MPI cannot tell peers that wait in a collective to stop, but mpirun stops
  // every rank when one aborts. Under ddp-run it tells ddp-run instead (which tells the peers),
  // fails this rank's collectives, and returns.
  void abort(const std::string& reason);

  // Under ddp-run, the hand-over of elastic training (comm/run_agent.hpp): trainers leave their state
  // there when a peer dies, and start from what the previous membership left.
  // The last collectives this rank issued (comm/flight_recorder.hpp).
  comm::flight_recorder& recorder() noexcept { return *recorder_; }
  const comm::flight_recorder& recorder() const noexcept { return *recorder_; }

  elastic::rank_handoff handoff() const noexcept {
    return agent_ && agent_->world() == size_ ? agent_->handoff() : elastic::rank_handoff{};
  }

 private:
  // The collective tells the watchdog, without a lock or a clock read, which one this rank
  // entered last.
  template <issue_mode How, class Body>
  auto issue(How how, const char* name, std::size_t count, dtype type, reduce_op op, int root, Body body) {
    const std::uint64_t sequence = next_sequence_++;
    const std::uint64_t recorded = recorder_->issued(name, count, type, op, root);
    return progress_->issue(how, [=, this] {
      current_name_.store(name, std::memory_order_relaxed);
      entered_.store(sequence + 1, std::memory_order_relaxed);
      recorder_->started(recorded);
      try {
        body(name);
      } catch (const std::exception& e) {
        recorder_->dump_once(e.what());
        throw;
      }
      recorder_->completed(recorded);
    });
  }

  // `what` is a literal: a collective builds no message unless it fails.
  void require(bool ok, const char* op, const char* what) const {
    if (!ok) throw error("mpi", op, rank_, what);
  }
  void require_root(int root, const char* op) const {
    if (root < 0 || root >= size()) throw error("mpi", op, rank_, "root " + std::to_string(root) + " is not a rank");
  }

  int count(std::size_t n, const char* op) const {
    if (n > static_cast<std::size_t>(INT_MAX))
      throw error("mpi", op, rank_, "count " + std::to_string(n) + " exceeds MPI's int counts; split the buffer");
    return static_cast<int>(n);
  }

  static bool is_floating(dtype t) { return t == dtype::f32 || t == dtype::f64 || host::is_half(t); }

  // avg divides each contribution before the sum: exact at a power-of-two world; and always for
  // 16-bit data, whose sum (rounded at every step) overflows sooner.
  bool divides_first(dtype t) const { return host::is_half(t) || power_of_two_world(); }

  MPI_Op op_for(dtype t, reduce_op op) const { return host::is_half(t) ? half_ops_->get(t, op) : op_of(op); }

  void divide(mutable_buffer b) const;

  bool power_of_two_world() const { return (size_ & (size_ - 1)) == 0; }

  // A copy of `b` in the second scratch buffer (the first may hold a collective's output).
  void* keep(const_buffer b) {
    if (b.data == kept_.data()) return kept_.data();
    if (kept_.size() < b.bytes()) kept_.resize(b.bytes());
    std::memcpy(kept_.data(), b.data, b.bytes());
    return kept_.data();
  }
  const void* divided(const_buffer b) {
    void* copy = keep(b);
    divide(mutable_buffer{copy, b.count, b.type});
    return copy;
  }

  // out = sum(input) / size, from `sum(in, out)`, which runs the collective's sum of every rank's
  // `in`. Where a sum overflowed while its average would not, the element is summed again from
  // contributions divided first. Every rank holds the same sums, so all take the second
  // collective or none does.
  template <class Sum>
  void average_after_sum(const_buffer input, mutable_buffer out, Sum sum) {
    sum(input.data, out.data);
    visit_host_dtype(out.type, [&]<class T>(T) {
      if constexpr (std::is_floating_point_v<T>) {
        auto* avg = static_cast<T*>(out.data);
        if (!host::divide_and_find_nonfinite(avg, out.count, static_cast<T>(size_))) return;
        std::vector<T> again(out.count);
        sum(divided(input), again.data());
        for (std::size_t i = 0; i < out.count; ++i)
          if (!std::isfinite(avg[i]) && std::isfinite(again[i])) avg[i] = again[i];
      }
    });
  }

  // The watchdog's look: answers peers' roll calls; a collective past the timeout ends the job
  // (MPI cannot tell the peers), after a roll call of its own says who is missing.
  bool watch();

  static constexpr int query_tag = 1, answer_tag = 2;

  // Where this rank is: how many collectives it has entered, and whether it is inside one.
  void answer_roll_calls();

  // Asks every other rank where it is (each answers from its watchdog, within two of its polls)
  // and says which ranks have not arrived at collective #sequence, and which did not answer.
  std::string roll_call(std::uint64_t sequence);

  std::chrono::milliseconds poll_interval() const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm roll_ = MPI_COMM_NULL;  // the watchdogs' roll calls, apart from the collectives
  bool can_roll_call_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  options options_;
  std::optional<half_ops> half_ops_;  // made once MPI is known to be initialised
  std::uint64_t next_sequence_ = 0;
  // In-place reduce_scatter's result before it is copied into place; kept between calls (a
  // sharded update does one per bucket per step). Operations run one at a time, in issue order.
  std::vector<std::uint8_t> scratch_, kept_;

  std::uint64_t watched_op_ = 0;  // the watchdog's own: the operation it saw running, and since when
  std::chrono::steady_clock::time_point watched_since_;
  std::atomic<const char*> current_name_{""};  // the latest collective entered
  std::atomic<std::uint64_t> entered_{0};       // collectives this rank has entered
  std::optional<comm::flight_recorder> recorder_;  // before the threads that use it: destroyed after them
  std::optional<comm::watchdog> watchdog_;
  std::optional<comm::progress_thread> progress_;
  run::agent* agent_ = nullptr;  // under ddp-run
  int agent_failure_ = -1;
};

static_assert(diagnose_communicator<communicator>());

#if DDP_MPI_RUNTIME_DEFINITIONS

DDP_MPI_RUNTIME_INLINE communicator::communicator(MPI_Comm parent, options opts) : options_(opts) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized)
    throw error("mpi", "communicator", -1,
                "MPI is not initialised: create a ddp::mpi::environment first (in main, before any "
                "communicator)");
  half_ops_.emplace();
  check(MPI_Comm_dup(parent, &comm_), "comm_dup", -1);
  check(MPI_Comm_dup(parent, &roll_), "comm_dup", -1);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  int thread_level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&thread_level);
  can_roll_call_ = thread_level == MPI_THREAD_MULTIPLE;
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  const auto env = placement_from_environment();
  local_rank_ = env ? env->local_rank : 0;
  recorder_.emplace(backend_name, rank_, size_, opts.recorder.value_or(comm::recorder_options::from_environment()));
  watchdog_.emplace(poll_interval(), [this] { return watch(); });
  progress_.emplace();
  // Under ddp-run a dead peer fails every pending and later collective at once (MPI would wait
  // for it forever): collectives then run where that failure can reach their waiter.
  if ((agent_ = run::agent::current())) {
    progress_->make_interruptible();
    agent_failure_ = agent_->on_failure([this](int origin, const std::string& reason) {
      const std::string why = origin == rank_ ? "this rank gave up: " + reason
                                              : "rank " + std::to_string(origin) + " is gone: " + reason;
      recorder_->dump_once(why);
      progress_->break_queue(std::make_exception_ptr(peer_error("mpi", "collective", rank_, origin, why)));
    });
  }
}

DDP_MPI_RUNTIME_INLINE communicator::~communicator() {
  if (agent_) agent_->forget(agent_failure_);
  const bool broken = progress_->broken();
  progress_.reset();  // finishes queued collectives, then joins (a broken queue's thread is left behind)
  watchdog_.reset();
  if (broken) return;  // a collective may still wait inside MPI for the dead peer
  MPI_Comm_free(&roll_);
  MPI_Comm_free(&comm_);
}

DDP_MPI_RUNTIME_INLINE void communicator::abort(const std::string& reason) {
  recorder_->dump_once("this rank aborted: " + reason);
  if (agent_) return agent_->report_failure(reason);  // ddp-run tells the others; this rank's queue breaks
  std::fprintf(stderr, "ddp[mpi] rank %d aborts the job: %s\n", rank_, reason.c_str());
  std::fflush(stderr);
  MPI_Abort(comm_, 1);
}

DDP_MPI_RUNTIME_INLINE void communicator::divide(mutable_buffer b) const {
  if (host::is_half(b.type)) {
    host::visit_half_dtype(b.type, [&]<class F>(F) {
      host::divide_half<F>(static_cast<std::uint16_t*>(b.data), b.count, static_cast<float>(size_));
    });
    return;
  }
  visit_host_dtype(b.type, [&]<class T>(T) { host::divide(static_cast<T*>(b.data), b.count, static_cast<T>(size_)); });
}

DDP_MPI_RUNTIME_INLINE bool communicator::watch() {
  if (can_roll_call_) answer_roll_calls();
  // How long the running operation has run, from when this watchdog first saw it (a poll
  // interval late at most): the collectives themselves read no clock.
  const std::uint64_t running = progress_->running_op();
  const auto now = std::chrono::steady_clock::now();
  if (running == 0 || running != watched_op_) {
    watched_op_ = running;
    watched_since_ = now;
    return true;
  }
  if (now - watched_since_ <= options_.timeout) return true;
  // The operation running since then: the latest one entered (they run one at a time).
  const std::uint64_t stuck = entered_.load(std::memory_order_relaxed) - 1;
  const std::string why = std::string(current_name_.load(std::memory_order_relaxed)) + " #" + std::to_string(stuck) +
                          " made no progress for " + std::to_string(options_.timeout.count()) + " ms; " + roll_call(stuck);
  if (agent_) agent_->report_stall(why);  // ddp-run finds the rank that stopped making progress
  else abort(why);
  return false;
}

DDP_MPI_RUNTIME_INLINE void communicator::answer_roll_calls() {
  for (;;) {
    int asked = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, query_tag, roll_, &asked, &status);
    if (!asked) return;
    char query = 0;
    MPI_Recv(&query, 1, MPI_CHAR, status.MPI_SOURCE, query_tag, roll_, MPI_STATUS_IGNORE);
    // A peer timed out and will end the job once every rank answered: dump first.
    recorder_->dump_once("rank " + std::to_string(status.MPI_SOURCE) + " timed out in a collective and asked where this rank is");
    std::uint64_t where[2];
    where[0] = entered_.load(std::memory_order_relaxed);
    where[1] = progress_->running_op() != 0 ? 1 : 0;
    MPI_Send(where, 2, MPI_UINT64_T, status.MPI_SOURCE, answer_tag, roll_);
  }
}

DDP_MPI_RUNTIME_INLINE std::string communicator::roll_call(std::uint64_t sequence) {
  if (!can_roll_call_ || size_ == 1)
    return "a peer never joined it, or died (MPI gives less than MPI_THREAD_MULTIPLE, so the ranks "
           "were not asked where they are)";
  std::vector<std::uint64_t> where(2 * static_cast<std::size_t>(size_), 0);
  std::vector<MPI_Request> sends, answers(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
  std::vector<int> answered(static_cast<std::size_t>(size_), 0);
  char query = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Isend(&query, 1, MPI_CHAR, r, query_tag, roll_, &sends.emplace_back());
    MPI_Irecv(&where[2 * static_cast<std::size_t>(r)], 2, MPI_UINT64_T, r, answer_tag, roll_,
              &answers[static_cast<std::size_t>(r)]);
  }
  const auto deadline = std::chrono::steady_clock::now() + 2 * poll_interval() + std::chrono::seconds(1);
  int pending = size_ - 1;
  while (pending > 0 && std::chrono::steady_clock::now() < deadline) {
    answer_roll_calls();  // peers that timed out too are asking us
    for (int r = 0; r < size_; ++r) {
      auto& request = answers[static_cast<std::size_t>(r)];
      if (r == rank_ || answered[static_cast<std::size_t>(r)]) continue;
      MPI_Test(&request, &answered[static_cast<std::size_t>(r)], MPI_STATUS_IGNORE);
      if (answered[static_cast<std::size_t>(r)]) --pending;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::string missing, silent, here;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const auto i = static_cast<std::size_t>(r);
    if (!answered[i]) {
      silent += (silent.empty() ? "rank " : ", rank ") + std::to_string(r);
      continue;
    }
    const std::uint64_t entered = where[2 * i];
    if (entered > sequence) continue;
    missing += (missing.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " has not arrived (" +
               (entered == 0 ? std::string("it has entered no collective yet")
                             : "its last collective is #" + std::to_string(entered - 1) +
                                   (where[2 * i + 1] ? ", still running" : ", finished")) +
               ")";
  }
  for (int r = 0; r < size_; ++r)
    if (r == rank_ || (answered[static_cast<std::size_t>(r)] && where[2 * static_cast<std::size_t>(r)] > sequence))
      here += (here.empty() ? "" : ", ") + std::to_string(r);
  std::string report = missing.empty() ? "every rank that answered has arrived" : missing;
  if (!silent.empty()) report += "; " + silent + " did not answer (dead, or the process is stuck)";
  return report + "; ranks in it: " + here;
}

DDP_MPI_RUNTIME_INLINE std::chrono::milliseconds communicator::poll_interval() const {
  return std::min<std::chrono::milliseconds>(options_.timeout / 4, std::chrono::seconds(1));
}

#endif  // DDP_MPI_RUNTIME_DEFINITIONS

}  // namespace ddp::mpi
