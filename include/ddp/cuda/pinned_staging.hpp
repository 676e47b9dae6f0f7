#pragma once
// Uploads from pageable host memory through page-locked (pinned) buffers: the caller's bytes are
// copied into a pinned buffer and the transfer is queued from there, so it runs at the link's
// full rate and asynchronously, and the caller may free its source as soon as upload returns
// (as with cudaMemcpyAsync from pageable memory, which the driver stages through a small buffer
// of its own, in pieces, waiting for each). Two buffers take turns: filling one never waits for
// the transfer just queued from the other; a buffer is reused once its last transfer finished,
// which the caller waits for only when it uploads faster than the GPU reads.
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstring>

#include "ddp/cuda/check.hpp"
#include "ddp/cuda/stream.hpp"

namespace ddp::cuda {

class pinned_staging {
 public:
  explicit pinned_staging(call_site site) : site_(site), slots_{slot{event(site)}, slot{event(site)}} {}
  pinned_staging(const pinned_staging&) = delete;
  pinned_staging& operator=(const pinned_staging&) = delete;
  ~pinned_staging() {
    for (auto& s : slots_)
      if (s.data) {
        cudaEventSynchronize(s.copied.get());
        cudaFreeHost(s.data);
      }
  }

  // Queues dst (device memory) = src (any host memory), bytes long, on `stream`. Returns whether
  // it had to wait for an earlier transfer from the same buffer.
  bool upload(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
    auto& s = slots_[next_];
    next_ = 1 - next_;
    bool waited = false;
    if (s.used) {
      waited = !s.copied.done();
      if (waited) s.copied.synchronize();
    }
    if (s.capacity < bytes) {
      if (s.data) check(cudaFreeHost(s.data), "cudaFreeHost", site_);
      s.data = nullptr;
      s.capacity = 0;
      check(cudaHostAlloc(&s.data, bytes, cudaHostAllocDefault), "cudaHostAlloc", site_);
      s.capacity = bytes;
    }
    std::memcpy(s.data, src, bytes);
    check(cudaMemcpyAsync(dst, s.data, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync", site_);
    s.copied.record(stream);
    s.used = true;
    return waited;
  }

 private:
  struct slot {
    event copied;
    void* data = nullptr;
    std::size_t capacity = 0;
    bool used = false;
  };
  call_site site_;
  std::array<slot, 2> slots_;
  int next_ = 0;
};

}  // namespace ddp::cuda
