#pragma once
// NCCL statuses turned into ddp::error, with NCCL's own last message and the usual fix.
#include <nccl.h>

#include <string>
#include <string_view>

#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/reduce_op.hpp"

namespace ddp::nccl {

// NCCL's message and last error, with the usual cause and fix. `operation` decides the hint for
// ncclInvalidUsage: at communicator creation it is most often two ranks on one GPU, elsewhere an
// argument NCCL rejected or a call on a communicator that was destroyed or aborted.
inline std::string describe(ncclResult_t r, ncclComm_t comm, std::string_view operation = {}) {
  std::string s = ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(comm); last && *last) s += std::string(" (") + last + ")";
  switch (r) {
    case ncclInvalidUsage:
      if (operation.starts_with("ncclCommInit"))
        s += "; NCCL refuses two ranks on one GPU: give every rank its own device (one rank per GPU)";
      else
        s += "; NCCL rejected an argument (count, dtype, reduction, root, a buffer on another device) or the "
             "communicator was destroyed or aborted: check the call named here";
      break;
    case ncclRemoteError:
    case ncclSystemError:
      s += "; a peer process or the network failed: see that rank's log";
      break;
    default:
      break;
  }
  return s;
}

inline void check(ncclResult_t r, const char* operation, int rank, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  throw error("nccl", operation, rank, std::string(operation) + " failed: " + describe(r, comm, operation));
}

inline ncclDataType_t datatype_of(dtype t) {
  switch (t) {
    case dtype::f32: return ncclFloat32;
    case dtype::f64: return ncclFloat64;
    case dtype::i32: return ncclInt32;
    case dtype::i64: return ncclInt64;
    case dtype::u8: return ncclUint8;
    case dtype::f16: return ncclFloat16;
    case dtype::bf16: return ncclBfloat16;
  }
  return ncclFloat32;
}

// NCCL averages natively (integers: sum, then divide), so avg needs no extra kernel.
inline ncclRedOp_t op_of(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::avg: return ncclAvg;
    case reduce_op::min: return ncclMin;
    case reduce_op::max: return ncclMax;
  }
  return ncclSum;
}

}  // namespace ddp::nccl
