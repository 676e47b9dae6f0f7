#pragma once
// The MPI communicator (OpenMPI): one rank per process, host memory, for one or many machines.
// Collectives run on a progress thread in issue order, so the asynchronous forms overlap the
// caller's compute (the trainer's bucket reductions overlap backward).
//
// MPI has no timeouts and does not tell peers that a rank died. ddp adds both:
//   - a watchdog ends the job (MPI_Abort) when one collective runs longer than the timeout,
//     after printing which collective, its sequence number and the rank that gave up;
//   - abort(reason) prints the reason and ends the job; mpirun then stops every rank.
// A rank that throws out of main ends its process, and mpirun stops the others as well.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ddp/comm/progress_thread.hpp"
#include "ddp/comm/watchdog.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/host/kernels.hpp"
#include "ddp/mpi/check.hpp"
#include "ddp/mpi/environment.hpp"

namespace ddp::mpi {

struct options {
  // A collective that runs longer than this ends the job with a message naming it.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

inline MPI_Datatype datatype_of(dtype t) {
  switch (t) {
    case dtype::f32: return MPI_FLOAT;
    case dtype::f64: return MPI_DOUBLE;
    case dtype::i32: return MPI_INT32_T;
    case dtype::i64: return MPI_INT64_T;
    case dtype::u8: return MPI_UINT8_T;
    default: break;
  }
  throw error("mpi", "datatype", -1, "dtype " + std::string(name_of(t)) + " has no MPI reduction here; cast to f32");
}

inline MPI_Op op_of(reduce_op op) {
  switch (op) {
    case reduce_op::sum: case reduce_op::avg: return MPI_SUM;  // avg: sum, then divide
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
  explicit communicator(MPI_Comm parent = MPI_COMM_WORLD, options opts = {}) : options_(opts) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
      throw error("mpi", "communicator", -1,
                  "MPI is not initialised: create a ddp::mpi::environment first (in main, before any "
                  "communicator)");
    check(MPI_Comm_dup(parent, &comm_), "comm_dup", -1);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    const auto env = placement_from_environment();
    local_rank_ = env ? env->local_rank : 0;
    watchdog_.emplace(std::min<std::chrono::milliseconds>(options_.timeout / 4, std::chrono::seconds(1)),
                      [this] { return watch(); });
    progress_.emplace();
  }
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;

  ~communicator() {
    progress_.reset();  // finishes queued collectives, then joins
    watchdog_.reset();
    MPI_Comm_free(&comm_);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  // This process's index on its machine (mpirun's OMPI_COMM_WORLD_LOCAL_RANK, Slurm's
  // SLURM_LOCALID): the GPU a rank binds.
  int local_rank() const noexcept { return local_rank_; }
  MPI_Comm native() const noexcept { return comm_; }

  work all_reduce(const_buffer send, mutable_buffer recv, reduce_op op) {
    return submit("all_reduce", [=, this](const char* name) {
      require(recv.count == send.count && recv.type == send.type, name, "recv must have the count and dtype of send");
      const void* in = send.data == recv.data ? MPI_IN_PLACE : send.data;
      check(MPI_Allreduce(in, recv.data, count(send.count, name), datatype_of(send.type), op_of(op), comm_), name, rank_);
      if (op == reduce_op::avg) divide(recv);
    });
  }

  work broadcast(mutable_buffer buf, int root) {
    return submit("broadcast", [=, this](const char* name) {
      require(root >= 0 && root < size_, name, "root " + std::to_string(root) + " is not a rank");
      check(MPI_Bcast(buf.data, count(buf.count, name), datatype_of(buf.type), root, comm_), name, rank_);
    });
  }

  work all_gather(const_buffer send, mutable_buffer recv) {
    return submit("all_gather", [=, this](const char* name) {
      require(recv.count == send.count * static_cast<std::size_t>(size_) && recv.type == send.type, name,
              "recv must hold size() * send.count elements of send's dtype");
      const auto* own = static_cast<const char*>(recv.data) + static_cast<std::size_t>(rank_) * send.bytes();
      const void* in = send.data == own ? MPI_IN_PLACE : send.data;
      const int n = count(send.count, name);
      check(MPI_Allgather(in, n, datatype_of(send.type), recv.data, n, datatype_of(send.type), comm_), name, rank_);
    });
  }

  work reduce_scatter(const_buffer send, mutable_buffer recv, reduce_op op) {
    return submit("reduce_scatter", [=, this](const char* name) {
      require(send.count == recv.count * static_cast<std::size_t>(size_) && recv.type == send.type, name,
              "send must hold size() * recv.count elements of recv's dtype");
      // MPI's in-place form differs from ours (recv inside send): reduce into scratch then.
      const auto* own = static_cast<const char*>(send.data) + static_cast<std::size_t>(rank_) * recv.bytes();
      const bool in_place = own == recv.data && recv.count > 0;
      if (in_place && scratch_.size() < recv.bytes()) scratch_.resize(recv.bytes());
      void* out = in_place ? scratch_.data() : recv.data;
      check(MPI_Reduce_scatter_block(send.data, out, count(recv.count, name), datatype_of(send.type), op_of(op), comm_),
            name, rank_);
      if (in_place) std::memcpy(recv.data, scratch_.data(), recv.bytes());
      if (op == reduce_op::avg) divide(recv);
    });
  }

  work barrier() {
    return submit("barrier", [this](const char* name) { check(MPI_Barrier(comm_), name, rank_); });
  }

  // Ends the job: MPI cannot tell peers that wait in a collective to stop, but mpirun stops
  // every rank when one aborts.
  void abort(const std::string& reason) {
    std::fprintf(stderr, "ddp[mpi] rank %d aborts the job: %s\n", rank_, reason.c_str());
    std::fflush(stderr);
    MPI_Abort(comm_, 1);
  }

 private:
  template <class Body>
  work submit(const char* name, Body body) {
    const std::uint64_t sequence = next_sequence_++;
    return progress_->submit([=, this] {
      {
        std::lock_guard lock(watch_mutex_);
        current_ = running{name, sequence, std::chrono::steady_clock::now()};
      }
      try {
        body(name);
      } catch (...) {
        std::lock_guard lock(watch_mutex_);
        current_.reset();
        throw;
      }
      std::lock_guard lock(watch_mutex_);
      current_.reset();
    });
  }

  void require(bool ok, const char* op, const std::string& what) const {
    if (!ok) throw error("mpi", op, rank_, what);
  }

  int count(std::size_t n, const char* op) const {
    if (n > static_cast<std::size_t>(INT_MAX))
      throw error("mpi", op, rank_, "count " + std::to_string(n) + " exceeds MPI's int counts; split the buffer");
    return static_cast<int>(n);
  }

  void divide(mutable_buffer b) const {
    visit_host_dtype(b.type, [&]<class T>(T) { host::divide(static_cast<T*>(b.data), b.count, static_cast<T>(size_)); });
  }

  // The watchdog's look: a collective past the timeout ends the job (MPI cannot tell the peers).
  bool watch() {
    std::unique_lock lock(watch_mutex_);
    if (!current_ || std::chrono::steady_clock::now() - current_->started <= options_.timeout) return true;
    const std::string what = std::string(current_->name) + " #" + std::to_string(current_->sequence) +
                             " made no progress for " + std::to_string(options_.timeout.count()) +
                             " ms: a peer never joined it, or died";
    lock.unlock();
    abort(what);
    return false;
  }

  struct running {
    const char* name;
    std::uint64_t sequence;
    std::chrono::steady_clock::time_point started;
  };

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  options options_;
  std::uint64_t next_sequence_ = 0;
  // In-place reduce_scatter's result before it is copied into place; kept between calls (a
  // sharded update does one per bucket per step). Operations run one at a time, in issue order.
  std::vector<std::uint8_t> scratch_;

  std::mutex watch_mutex_;
  std::optional<running> current_;
  std::optional<comm::watchdog> watchdog_;
  std::optional<progress_thread> progress_;
};

static_assert(diagnose_communicator<communicator>());

}  // namespace ddp::mpi
