// ddp::nccl: the NCCL communicator's headers and libnccl.
#include <ddp/nccl/communicator.hpp>

#include <string>

std::string uses_nccl() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return "ncclGetVersion failed";
  return "ok: ddp::nccl linked against NCCL " + std::to_string(version);
}
