#pragma once
// CUDA runtime and cuBLAS statuses turned into ddp::error, naming the call, the device, the rank
// and the place in the source that made it, with the usual fix for the common failures.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <source_location>
#include <string>

#include "ddp/core/error.hpp"

namespace ddp::cuda {

// Who made a call: the rank (-1 when none) and the CUDA device ordinal.
struct call_site {
  int rank = -1;
  int device = 0;
};

namespace detail {

inline std::string where(const call_site& site, const std::source_location& loc) {
  return " on cuda:" + std::to_string(site.device) + " (" + loc.file_name() + ":" + std::to_string(loc.line()) + ")";
}

inline std::string hint(cudaError_t status) {
  switch (status) {
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
      return "; this machine has no usable GPU (or its driver is older than the CUDA toolkit): run on a "
             "GPU machine, or use the host path (ddp::host::device with the inproc or mpi communicator)";
    case cudaErrorInvalidDevice:
      return "; the ordinal is not one of the visible devices: check CUDA_VISIBLE_DEVICES and that "
             "no more ranks per machine are started than it has GPUs";
    case cudaErrorMemoryAllocation:
      return "; the device is out of memory: lower the batch or the bucket cap, or free other tensors";
    default:
      return "";
  }
}

}  // namespace detail

inline void check(cudaError_t status, const char* operation, call_site site = {},
                  std::source_location loc = std::source_location::current()) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clears a non-sticky error so the next call does not report it again
  throw error("cuda", operation, site.rank,
              std::string(operation) + " failed with " + cudaGetErrorName(status) + " (" +
                  cudaGetErrorString(status) + ")" + detail::where(site, loc) + detail::hint(status));
}

inline void check(cublasStatus_t status, const char* operation, call_site site = {},
                  std::source_location loc = std::source_location::current()) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw error("cuda", operation, site.rank,
              std::string(operation) + " failed with " + cublasGetStatusName(status) + " (" +
                  cublasGetStatusString(status) + ")" + detail::where(site, loc));
}

// How many CUDA devices this process sees; throws the driver's reason when it cannot tell
// (no GPU, no driver), so a GPU path never goes on to fail somewhere less clear.
inline int device_count(call_site site = {}) {
  int n = 0;
  check(cudaGetDeviceCount(&n), "cudaGetDeviceCount", site);
  return n;
}

}  // namespace ddp::cuda
