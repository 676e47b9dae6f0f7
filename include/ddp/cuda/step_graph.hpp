#pragma once
// ddp::cuda::step_graph: a trainer's whole step (forward, backward, every bucket's collective,
// the update) captured once into a CUDA graph and replayed: one launch per step instead of one
// per kernel, copy and collective, and no host work between them.
//
//   ddp::cuda::step_graph graph(trainer, [&](auto& replica) {   // x, y: device memory
//     replica.backward(loss(replica.forward(x), y).grad);
//   });                        // one ordinary step (the warm-up), then the capture
//   for (const auto& batch : rest) {
//     copy batch into x and y (on the device's stream);
//     graph.replay();          // one more step
//   }
//
// The step function runs on the host only while being captured: it must read its inputs from
// device memory whose address stays (copy each batch into the same buffers), and may read
// nothing back on the host (the device refuses copy_to_host and copy_from_host while capturing,
// naming the call). What the trainer decides on the host is decided once, at capture: every
// replay is one micro-batch on every rank and updates every parameter. The trainer refuses a
// configuration that decides per step (gradient clipping, optim::external, an optimizer whose
// rule changes with the update count such as AdamW's bias correction, a hook with host state),
// naming it. A changed optimizer (trainer.optimizer().lr = ..., a schedule) or a new parameter
// group is captured again on the next replay(); captures() counts them.
//
// The communicator must queue its collectives on the GPU and watch a graph launch
// (ddp::nccl::communicator): each replay is watched as one collective, so a peer that dies or a
// replay that runs past the timeout fails every rank, as an uncaptured step would.
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/cuda/check.hpp"
#include "ddp/cuda/device.hpp"

namespace ddp::cuda {

// What one captured step queues: the graph's nodes by kind.
struct graph_nodes {
  std::size_t kernels = 0;  // ddp's, the layers', cuBLAS's and NCCL's kernels
  std::size_t copies = 0;
  std::size_t memsets = 0;
  std::size_t allocations = 0;  // cudaMallocAsync inside the step (the layers' temporaries)
  std::size_t frees = 0;        // cudaFreeAsync inside the step
  std::size_t other = 0;        // event records and waits, empty joins
};

template <class Trainer>
class step_graph {
  using communicator_type = typename Trainer::communicator_type;
  using optimizer_type = typename Trainer::optimizer_type;
  static_assert(std::is_same_v<typename Trainer::device_type, cuda::device>,
                "ddp::cuda::step_graph captures a trainer on ddp::cuda::device");
  static_assert(requires(communicator_type& c) { c.watch("step", [] {}); },
                "ddp::cuda::step_graph needs a communicator that queues its collectives on the GPU and can watch "
                "a graph launch (ddp::nccl::communicator); a host-staged one cannot be captured");
  static_assert(std::equality_comparable<optimizer_type>,
                "ddp::cuda::step_graph compares the optimizer with the one it captured, to capture again after a "
                "change: give the optimizer `bool operator==(const T&) const = default;`");

 public:
  using replica = typename Trainer::replica;
  using work_type = decltype(std::declval<communicator_type&>().watch("step", [] {}));

  // Every refusal (trainer.capture_refusal()) is decided here, before the warm-up runs anything,
  // and again by trainer.capture() before it calls record, that is before cudaStreamBeginCapture:
  // a refused capture has queued nothing, allocated nothing inside a graph, and aborted no peer
  // (tests/trainer/update_options_test.cpp checks that side on host ranks).
  template <class F>
  step_graph(Trainer& trainer, F&& step_fn) : trainer_(trainer), step_(std::forward<F>(step_fn)) {
    if (const auto why = trainer_.capture_refusal()) fail("capture", *why);
    // Warm-up, uncaptured: cuBLAS handles, the memory pool and the hooks' scratch come into being
    // here, as nothing may be created inside the capture.
    trainer_.step(step_);
    capture();
  }
  step_graph(const step_graph&) = delete;
  step_graph& operator=(const step_graph&) = delete;
  ~step_graph() { release(); }

  // One more step: the captured one, launched on the device's compute stream (asynchronously).
  void replay() {
    if (const auto why = trainer_.capture_refusal()) fail("replay", *why);
    // Captured again after a change, or after a capture that failed (nothing to launch).
    if (!exec_ || !(trainer_.optimizer() == optimizer_) || trainer_.parameter_group_count() != groups_) {
      release();
      capture();
    }
    auto& dev = trainer_.device();
    last_ = trainer_.communicator().watch("captured step", [&] {
      check(cudaGraphLaunch(exec_, dev.stream()), "cudaGraphLaunch (a captured step)", dev.site());
    });
    trainer_.replayed(added_);
  }

  // Times the step was captured: 1, and 1 more for every change of the optimizer or its groups.
  std::size_t captures() const noexcept { return captures_; }
  const graph_nodes& nodes() const noexcept { return nodes_; }
  // The last replay's handle (test(), rethrow_failure() after a host synchronisation).
  const std::optional<work_type>& last_replay() const noexcept { return last_; }

 private:
  [[noreturn]] void fail(const char* operation, const std::string& why) const {
    throw error("cuda", std::string("step_graph ") + operation, trainer_.communicator().rank(),
                "this step cannot be captured into a CUDA graph: " + why);
  }

  void capture() {
    auto& dev = trainer_.device();
    dev.activate();
    cudaGraph_t graph = nullptr;
    cudaError_t ended = cudaSuccess;
    added_ = trainer_.capture(step_, [&](auto&& run_step) {
      // Thread-local: the communicator's watchdog thread goes on querying its own events meanwhile.
      check(cudaStreamBeginCapture(dev.stream(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture", dev.site());
      try {
        run_step();
      } catch (...) {
        cudaStreamEndCapture(dev.stream(), &graph);
        if (graph) cudaGraphDestroy(graph);
        throw;
      }
      ended = cudaStreamEndCapture(dev.stream(), &graph);
    });
    if (ended != cudaSuccess || !graph) {
      if (graph) cudaGraphDestroy(graph);
      throw error("cuda", "step_graph capture", dev.rank(),
                  std::string("capturing the step on ") + dev.id().to_string() + " failed (" +
                      cudaGetErrorString(ended) +
                      "): something in the step waited for the GPU (cudaDeviceSynchronize, cudaMalloc, a blocking "
                      "copy) or used a stream that did not join the capture");
    }
    graph_ = graph;
    nodes_ = count_nodes(graph);
    // The step's temporaries (device_vector: cudaMallocAsync) become the graph's allocation nodes.
    // One the step frees is freed inside the graph; one that outlives the step (a result the
    // step function keeps, or a library's workspace: cuBLAS may allocate its own with
    // cudaMallocAsync inside a capture) stays allocated after the launch, and with flags 0 the
    // next cudaGraphLaunch fails (cudaErrorInvalidValue) while it is. AutoFreeOnLaunch frees such
    // allocations at the start of each launch instead, so every replay works and what a step
    // keeps lives until the next replay, as a step's results do without a graph.
    check(cudaGraphInstantiate(&exec_, graph_, cudaGraphInstantiateFlagAutoFreeOnLaunch), "cudaGraphInstantiate",
          dev.site());
    // Uploaded now, on the stream, so the first replay's launch neither uploads the graph nor maps
    // memory for its allocations.
    check(cudaGraphUpload(exec_, dev.stream()), "cudaGraphUpload", dev.site());
    optimizer_ = trainer_.optimizer();
    groups_ = trainer_.parameter_group_count();
    ++captures_;
  }

  static graph_nodes count_nodes(cudaGraph_t graph) {
    std::size_t n = 0;
    check(cudaGraphGetNodes(graph, nullptr, &n), "cudaGraphGetNodes");
    std::vector<cudaGraphNode_t> all(n);
    check(cudaGraphGetNodes(graph, all.data(), &n), "cudaGraphGetNodes");
    graph_nodes counts;
    for (auto node : all) {
      cudaGraphNodeType type{};
      check(cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType");
      if (type == cudaGraphNodeTypeKernel) ++counts.kernels;
      else if (type == cudaGraphNodeTypeMemcpy) ++counts.copies;
      else if (type == cudaGraphNodeTypeMemset) ++counts.memsets;
      else if (type == cudaGraphNodeTypeMemAlloc) ++counts.allocations;
      else if (type == cudaGraphNodeTypeMemFree) ++counts.frees;
      else ++counts.other;
    }
    return counts;
  }

  // Waits for replays in flight: a graph may not go while it runs.
  void release() noexcept {
    if (exec_) {
      cudaStreamSynchronize(trainer_.device().stream());
      cudaGraphExecDestroy(exec_);
      exec_ = nullptr;
    }
    if (graph_) cudaGraphDestroy(graph_);
    graph_ = nullptr;
  }

  Trainer& trainer_;
  std::function<void(replica&)> step_;
  typename Trainer::core_type::captured_step added_;
  optimizer_type optimizer_{};
  std::size_t groups_ = 0;
  std::size_t captures_ = 0;
  graph_nodes nodes_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  std::optional<work_type> last_;
};

template <class Trainer, class F>
step_graph(Trainer&, F&&) -> step_graph<Trainer>;

}  // namespace ddp::cuda
