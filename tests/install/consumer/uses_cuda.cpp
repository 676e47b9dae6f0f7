// ddp::cuda: the CUDA device's headers and ddp's compiled kernels (libddp_cuda_kernels); no GPU
// is needed to link, and without one the device count is an error that says so.
#include <ddp/cuda/device.hpp>

#include <string>

std::string uses_cuda() {
  volatile auto launcher = &ddp::cuda::kernels::scale;  // resolved from the installed library
  if (!launcher) return "ddp::cuda kernels missing";
  try {
    return "ok: ddp::cuda linked; " + std::to_string(ddp::cuda::device_count()) + " GPU(s)";
  } catch (const ddp::error& e) {
    return std::string("ok: ddp::cuda linked; no usable GPU here (") + e.detail().substr(0, 60) + ")";
  }
}
