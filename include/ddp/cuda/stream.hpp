#pragma once
// Owning handles of a CUDA stream and a CUDA event.
#include <cuda_runtime.h>

#include <utility>

#include "ddp/cuda/check.hpp"

namespace ddp::cuda {

// A non-blocking stream on the site's GPU: it never waits for the legacy default stream.
class stream {
 public:
  explicit stream(call_site site, int priority = 0) : site_(site) {
    check(cudaSetDevice(site.device), "cudaSetDevice", site_);
    check(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority), "cudaStreamCreateWithPriority", site_);
  }
  stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)), site_(o.site_) {}
  stream& operator=(stream&& o) noexcept {
    std::swap(s_, o.s_);
    site_ = o.site_;
    return *this;
  }
  ~stream() {
    if (s_) cudaStreamDestroy(s_);
  }

  cudaStream_t get() const noexcept { return s_; }
  void synchronize() const { check(cudaStreamSynchronize(s_), "cudaStreamSynchronize", site_); }
  // Work queued on this stream from now on starts after everything `e` recorded.
  void wait(cudaEvent_t e) const { check(cudaStreamWaitEvent(s_, e, 0), "cudaStreamWaitEvent", site_); }

  // The highest priority the device offers (communication streams use it, so a reduction is not
  // queued behind a backward's kernels).
  static int greatest_priority(call_site site) {
    int least = 0, greatest = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange", site);
    return greatest;
  }

 private:
  cudaStream_t s_ = nullptr;
  call_site site_;
};

// An event on the site's GPU, without timing unless asked (the cheap kind): marks a point in a
// stream that others wait for.
class event {
 public:
  explicit event(call_site site, bool timing = false) : site_(site) {
    check(cudaSetDevice(site.device), "cudaSetDevice", site_);
    check(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreate", site_);
  }
  event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)), site_(o.site_) {}
  event& operator=(event&& o) noexcept {
    std::swap(e_, o.e_);
    site_ = o.site_;
    return *this;
  }
  ~event() {
    if (e_) cudaEventDestroy(e_);
  }

  cudaEvent_t get() const noexcept { return e_; }
  void record(cudaStream_t s) const { check(cudaEventRecord(e_, s), "cudaEventRecord", site_); }
  // True once everything recorded before it has finished; throws a device error it finds.
  bool done() const {
    const cudaError_t status = cudaEventQuery(e_);
    if (status == cudaErrorNotReady) return false;
    check(status, "cudaEventQuery", site_);
    return true;
  }
  void synchronize() const { check(cudaEventSynchronize(e_), "cudaEventSynchronize", site_); }

 private:
  cudaEvent_t e_ = nullptr;
  call_site site_;
};

}  // namespace ddp::cuda
