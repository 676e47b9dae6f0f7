#pragma once
// One error type for every failure the library reports: it records which backend
// and operation failed and on which rank, so a log line from any rank says where.
#include <stdexcept>
#include <string>
#include <utility>

#include "ddp/core/compiled_runtime.hpp"

namespace ddp {

class error : public std::runtime_error {
 public:
  error(std::string backend, std::string operation, int rank, const std::string& what);

  // Backend that raised it: "inproc", "mpi", "nccl", "cuda", "host", "trainer", "data", ...
  const std::string& backend() const noexcept { return backend_; }
  // Operation that failed: "all_reduce", "construct", "step", "read_idx", ...
  const std::string& operation() const noexcept { return operation_; }
  // Rank that raised it; -1 when no rank is involved (a file reader, say).
  int rank() const noexcept { return rank_; }
  // The message without the "ddp[backend] operation on rank r:" prefix.
  const std::string& detail() const noexcept { return detail_; }

 private:
  static std::string format(const std::string& backend, const std::string& operation, int rank,
                            const std::string& what);

  std::string backend_;
  std::string operation_;
  int rank_;
  std::string detail_;
};

// Raised on every rank alike after the ranks agreed on a problem (a consensus check): no peer
// waits for this rank, so the communicator need not be aborted.
class collective_error : public error {
 public:
  using error::error;
};

// Raised on a rank whose collective could not finish because another rank failed,
// left, or never arrived. `origin_rank` is the rank at fault (-1 when unknown).
class peer_error : public error {
 public:
  peer_error(std::string backend, std::string operation, int rank, int origin_rank,
             const std::string& what)
      : error(std::move(backend), std::move(operation), rank, what), origin_rank_(origin_rank) {}
  int origin_rank() const noexcept { return origin_rank_; }

 private:
  int origin_rank_;
};

// Raised when a collective waits longer than the communicator's timeout.
class timeout_error : public peer_error {
 public:
  using peer_error::peer_error;
};

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE error::error(std::string backend, std::string operation, int rank, const std::string& what)
    : std::runtime_error(format(backend, operation, rank, what)),
      backend_(std::move(backend)),
      operation_(std::move(operation)),
      rank_(rank),
      detail_(what) {}

DDP_RUNTIME_INLINE std::string error::format(const std::string& backend, const std::string& operation, int rank,
    const std::string& what) {
  std::string s = "ddp[" + backend + "] " + operation;
  if (rank >= 0) s += " on rank " + std::to_string(rank);
  return s + ": " + what;
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp
