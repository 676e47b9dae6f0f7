#pragma once
// The CUDA device: tensors in one GPU's memory, the trainer's kernels queued on one compute
// stream in call order. A model of ddp::device (ddp/concepts/device.hpp).
//
//   ddp::cuda::device dev(comm.local_rank(), comm.rank());   // ordinal, rank for messages
//
// Every call makes the ordinal current on the calling thread first, so in-process ranks (one
// thread per GPU) and a user's own cudaSetDevice calls cannot send work to the wrong GPU.
// Kernels come from ddp/cuda/kernels.cuh, compiled once into the target by ddp::cuda.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "ddp/concepts/device.hpp"
#include "ddp/cuda/check.hpp"
#include "ddp/cuda/kernels.hpp"
#include "ddp/cuda/pinned_staging.hpp"
#include "ddp/cuda/stream.hpp"

namespace ddp::cuda {

class device {
 public:
  static constexpr device_kind kind = device_kind::cuda;

  explicit device(int ordinal = 0, int rank = -1) : site_{rank, ordinal}, stream_(select(site_)) {
    check(cudaDeviceGetAttribute(&limits_.multiprocessors, cudaDevAttrMultiProcessorCount, ordinal),
          "cudaDeviceGetAttribute", site_);
    keep_pool_memory();
  }
  device(const device&) = delete;
  device& operator=(const device&) = delete;
  // Gives back what the memory pools keep unused (trim_memory), so a device that goes away leaves
  // none of its temporaries' memory reserved for the rest of the process.
  ~device() {
    if (blas_) cublasDestroy(blas_);
    deallocate(reduction_scratch_, reduction_scratch_bytes);
    cudaSetDevice(site_.device);
    cudaStreamSynchronize(stream());  // the temporaries freed on it are back in the pool once it gets there
    trim_pools();
  }

  device_id id() const noexcept { return device_id::cuda(site_.device); }
  int ordinal() const noexcept { return site_.device; }
  int rank() const noexcept { return site_.rank; }
  call_site site() const noexcept { return site_; }
  // The compute stream: the trainer's kernels, and a communicator bound to this device orders
  // its collectives after the work queued here.
  cudaStream_t stream() const noexcept { return stream_.get(); }
  // This stream's cuBLAS handle (created on first use).
  cublasHandle_t blas() {
    activate();
    if (!blas_) {
      check(cublasCreate(&blas_), "cublasCreate", site_);
      check(cublasSetStream(blas_, stream()), "cublasSetStream", site_);
    }
    return blas_;
  }
  // Makes this device current on the calling thread.
  void activate() const { check(cudaSetDevice(site_.device), "cudaSetDevice", site_); }

  // How many times the host has waited for this GPU (copy_to_host, synchronize, sum_of_squares,
  // deallocate, an upload that waited for a pinned buffer): the example prints it per
  // step, where every one is a bubble in the GPU's queue.
  std::uint64_t host_waits() const noexcept { return host_waits_.load(std::memory_order_relaxed); }
  void note_host_wait() noexcept { host_waits_.fetch_add(1, std::memory_order_relaxed); }

  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    activate();
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc", site_);
    const std::size_t now = in_use_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    for (std::size_t seen = high_water_.load(std::memory_order_relaxed);
         seen < now && !high_water_.compare_exchange_weak(seen, now, std::memory_order_relaxed);) {
    }
    return p;
  }
  // The bytes allocated through allocate() and not yet freed (a trainer's buckets, gathered
  // parameters, optimizer state; not the stream-ordered pool of device_vector), and the most
  // there were at once since construction or the last reset.
  std::size_t memory_in_use() const noexcept { return in_use_.load(std::memory_order_relaxed); }
  std::size_t memory_high_water() const noexcept { return high_water_.load(std::memory_order_relaxed); }
  void reset_memory_high_water() noexcept { high_water_.store(memory_in_use(), std::memory_order_relaxed); }
  // Waits for the device first, so that no queued kernel (on any stream: NCCL's too) still reads
  // the memory: cudaFree itself only "may" synchronise (CUDA 13's header).
  void deallocate(void* p, std::size_t bytes) noexcept {
    if (!p) return;
    cudaSetDevice(site_.device);
    note_host_wait();
    cudaDeviceSynchronize();
    cudaFree(p);
    in_use_.fetch_sub(bytes, std::memory_order_relaxed);
  }

  void copy(void* dst, const void* src, std::size_t bytes) { enqueue_copy(dst, src, bytes, cudaMemcpyDeviceToDevice); }
  // The host source may be freed as soon as this returns. Up to 16 MiB (a batch's inputs) go
  // through this device's pinned buffers (pinned_staging.hpp), asynchronously; larger ones (a
  // checkpoint's tensors) through the driver's own staging, which keeps no pinned memory.
  void copy_from_host(void* dst, const void* src, std::size_t bytes) {
    if (!bytes || dst == src) return;
    refuse_while_capturing("copy_from_host",
                           "a captured upload would read this host memory again at every replay, after it has "
                           "changed or gone: copy the step's inputs into device memory before replay()");
    if (bytes > pinned_upload_limit) return enqueue_copy(dst, src, bytes, cudaMemcpyHostToDevice);
    activate();
    if (staging_.upload(dst, src, bytes, stream())) note_host_wait();
  }
  static constexpr std::size_t pinned_upload_limit = std::size_t{16} << 20;
  void copy_to_host(void* dst, const void* src, std::size_t bytes) {
    refuse_while_capturing("copy_to_host",
                           "the host cannot read a value inside a captured step (nothing runs until replay()): "
                           "read it after replay(), or leave it out of the step");
    enqueue_copy(dst, src, bytes, cudaMemcpyDeviceToHost);
    note_host_wait();
    stream_.synchronize();
  }
  void fill_zero(void* dst, std::size_t bytes) {
    if (!bytes) return;
    activate();
    check(cudaMemsetAsync(dst, 0, bytes, stream()), "cudaMemsetAsync", site_);
  }

  void scale(float* x, std::size_t n, float factor) {
    activate();
    check(kernels::scale(x, n, factor, limits_, stream()), "scale kernel", site_);
  }
  // Waits for the queue: the sum comes back to the host.
  double sum_of_squares(const float* x, std::size_t n) {
    activate();
    if (!reduction_scratch_)
      reduction_scratch_ = static_cast<double*>(allocate(reduction_scratch_bytes));
    check(kernels::sum_of_squares(x, n, reduction_scratch_, reduction_scratch_ + kernels::sum_of_squares_blocks,
                                  stream()),
          "sum_of_squares kernel", site_);
    double result = 0.0;
    copy_to_host(&result, reduction_scratch_ + kernels::sum_of_squares_blocks, sizeof result);
    return result;
  }
  void pack(std::span<const segment> s, float* bucket) { copy_segments(s, bucket, kernels::direction::pack); }
  void unpack(std::span<const segment> s, const float* bucket) {
    copy_segments(s, const_cast<float*>(bucket), kernels::direction::unpack);
  }

  void cast(const_buffer src, mutable_buffer dst) { cast(src, dst, 1.0f); }
  // dst = src * factor, f32 -> f16 / bf16 (the product rounded in f32 first); factor 1 only the other way.
  void cast(const_buffer src, mutable_buffer dst, float factor) {
    if (src.count != dst.count)
      throw error("cuda", "cast", site_.rank,
                  "source has " + std::to_string(src.count) + " elements but destination " + std::to_string(dst.count));
    if (factor != 1.0f && src.type != dtype::f32)
      throw error("cuda", "cast", site_.rank,
                  "a factor scales only f32 sources, not " + std::string(name_of(src.type)) + "; cast, then scale");
    if (src.type == dst.type && factor == 1.0f) return copy(dst.data, src.data, src.bytes());
    activate();
    cudaError_t status = cudaSuccess;
    if (src.type == dst.type ||
        !kernels::cast(src.data, src.type, dst.data, dst.type, src.count, factor, limits_, stream(), status))
      throw error("cuda", "cast", site_.rank,
                  "no conversion from " + std::string(name_of(src.type)) + " to " + std::string(name_of(dst.type)) +
                      "; cast supports f32 <-> f16 / bf16");
    check(status, "cast kernel", site_);
  }

  // An optimizer's element rule over a bucket (ddp/optim/optimizer.hpp); its kernel is
  // instantiated by DDP_CUDA_OPTIMIZER in an nvcc translation unit (ddp's own for sgd and adamw).
  template <int S, class Rule>
  void elementwise(std::span<const segment> p, const float* g, float* state, std::size_t stride, const Rule& rule) {
    activate();
    check(kernels::elementwise<S, Rule>(p.data(), p.size(), g, state, stride, rule, limits_, stream()),
          "elementwise kernel", site_);
  }

  void synchronize() {
    refuse_while_capturing("synchronize", "a captured step cannot wait for the GPU: nothing runs until replay()");
    note_host_wait();
    stream_.synchronize();
  }

  // Hands the memory this GPU's pools keep for reuse back to the driver, as PyTorch's
  // torch.cuda.empty_cache() does: what cudaMallocAsync's pool (device_vector: the reference
  // layers' temporaries) holds beyond the allocations alive now, and what CUDA keeps for graphs
  // (step_graph's replays) that no graph running or queued uses. Call it after a phase whose
  // temporaries outgrew a step's (an evaluation with larger batches, a one-off large buffer); the
  // next step allocates its temporaries again. Waits for the stream: a temporary freed on it is
  // back in the pool once the stream gets there. The destructor does the same.
  void trim_memory() {
    refuse_while_capturing("trim_memory", "a captured step cannot wait for the GPU: nothing runs until replay()");
    activate();
    note_host_wait();
    stream_.synchronize();
    check(trim_pools(), "cudaMemPoolTrimTo / cudaDeviceGraphMemTrim", site_);
  }
  // Bytes the default pool holds (in use and kept for reuse), as the driver counts them.
  std::uint64_t pool_reserved_bytes() const {
    cudaMemPool_t pool = nullptr;
    check(cudaDeviceGetDefaultMemPool(&pool, site_.device), "cudaDeviceGetDefaultMemPool", site_);
    std::uint64_t bytes = 0;
    check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &bytes), "cudaMemPoolGetAttribute", site_);
    return bytes;
  }

  // Whether the compute stream is being captured into a CUDA graph (ddp::cuda::step_graph).
  bool capturing() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(stream(), &status), "cudaStreamIsCapturing", site_);
    return status != cudaStreamCaptureStatusNone;
  }

  // Where `p` lives according to the driver: a device pointer names its GPU, anything else is
  // host memory (the same-device check compares this with the rank's device).
  std::optional<device_id> locate(const void* p) const {
    cudaPointerAttributes attr{};
    check(cudaPointerGetAttributes(&attr, p), "cudaPointerGetAttributes", site_);
    if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) return device_id::cuda(attr.device);
    return device_id::cpu();
  }

 private:
  static call_site select(call_site site) {
    const int n = device_count(site);
    if (site.device < 0 || site.device >= n)
      throw error("cuda", "device", site.rank,
                  "device ordinal " + std::to_string(site.device) + " requested, but this process sees " +
                      std::to_string(n) + " CUDA device(s); start at most one rank per visible GPU on "
                      "each machine (CUDA_VISIBLE_DEVICES limits what a process sees)");
    check(cudaSetDevice(site.device), "cudaSetDevice", site);
    return site;
  }

  // cudaMallocAsync's pool (device_vector, the reference layers' per-step temporaries) returns
  // its memory to the driver at every synchronisation unless a release threshold says to keep it:
  // then each step maps and unmaps the same memory again. Keep it: the pool then holds the most
  // that was ever allocated from it at once (in a training loop, one step's temporaries), until
  // trim_memory() or a device's destructor gives back the part not in use. The threshold belongs
  // to the GPU's default pool, so it holds for everything in this process that allocates from it.
  void keep_pool_memory() {
    cudaMemPool_t pool = nullptr;
    check(cudaDeviceGetDefaultMemPool(&pool, site_.device), "cudaDeviceGetDefaultMemPool", site_);
    std::uint64_t keep = ~std::uint64_t{0};
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute", site_);
  }

  // Everything the default pool and the graph allocator keep and nobody uses goes back to the
  // driver (both release only memory no allocation, queued free or running graph still holds).
  cudaError_t trim_pools() const noexcept {
    cudaMemPool_t pool = nullptr;
    cudaError_t status = cudaDeviceGetDefaultMemPool(&pool, site_.device);
    if (status == cudaSuccess) status = cudaMemPoolTrimTo(pool, 0);
    const cudaError_t graphs = cudaDeviceGraphMemTrim(site_.device);
    return status != cudaSuccess ? status : graphs;
  }

  void refuse_while_capturing(const char* operation, const char* why) const {
    if (capturing())
      throw error("cuda", operation, site_.rank,
                  std::string("called while the step is being captured into a CUDA graph on ") +
                      id().to_string() + ": " + why);
  }

  void enqueue_copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
    if (!bytes || dst == src) return;
    activate();
    check(cudaMemcpyAsync(dst, src, bytes, kind, stream()), "cudaMemcpyAsync", site_);
  }

  void copy_segments(std::span<const segment> s, float* bucket, kernels::direction d) {
    activate();
    check(kernels::copy_segments(s.data(), s.size(), bucket, d, limits_, stream()),
          d == kernels::direction::pack ? "pack kernel" : "unpack kernel", site_);
  }

  call_site site_;
  cuda::stream stream_;
  pinned_staging staging_{site_};  // after stream_: its buffers go before the stream
  kernels::launch_limits limits_;
  cublasHandle_t blas_ = nullptr;
  static constexpr std::size_t reduction_scratch_bytes = (kernels::sum_of_squares_blocks + 1) * sizeof(double);
  double* reduction_scratch_ = nullptr;  // sum_of_squares: per-block partials, then the result
  std::atomic<std::uint64_t> host_waits_{0};
  std::atomic<std::size_t> in_use_{0};
  std::atomic<std::size_t> high_water_{0};
};

static_assert(diagnose_device<device>());

}  // namespace ddp::cuda
