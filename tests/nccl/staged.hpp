#pragma once
// The NCCL communicator seen through host memory, so the conformance suite (written for host
// buffers) runs on it unchanged: each collective copies its buffers to the GPU, runs there, and
// copies the result back. In-place forms map to in-place forms on the GPU.
//
// Each collective here is blocking (the copy back waits for the compute stream, which wait()
// ordered after the collective), and its handle reports the NCCL work's own completion: test()
// asks the collective's completion event, so the suite's asynchronous checks see whether the
// collective really finished before the copy back, not a constant.
//
// What one rank can and cannot check: with one GPU the world is one rank, so every reduction is
// a copy of the input (sum, avg, min and max of one value) and a broadcast or gather moves no
// byte between ranks. The suite then checks the plumbing: counts, dtypes, in- and out-of-place
// forms and the offsets they map to, the ordering between the compute stream and NCCL's stream,
// and completion. NCCL's arithmetic across ranks, a root other than 0 and the peers' part need
// two GPUs or more (tests/trainer/gpu_trainer_test.cpp runs 2 and 3 ranks on one GPU, but
// through ddp::comm::staged_communicator, not NCCL: NCCL refuses two ranks on one GPU).
#include <cstring>

#include "ddp/cuda/device_vector.hpp"
#include "ddp/nccl/communicator.hpp"

namespace gpu_test {

// A finished collective's handle: wait() orders the compute stream after it again (a no-op by
// now) and throws its failure; test() is the collective's own completion.
class done_work {
 public:
  done_work() = default;
  explicit done_work(ddp::nccl::work w) : work_(std::move(w)) {}
  void wait() const {
    work_.wait();
    work_.rethrow_failure();
  }
  bool test() const { return work_.test(); }

 private:
  ddp::nccl::work work_;
};

class staged {
 public:
  static constexpr ddp::device_kind memory_kind = ddp::device_kind::cpu;
  static constexpr std::string_view backend_name = "nccl (staged through host memory)";

  staged(ddp::nccl::communicator& comm, ddp::cuda::device& dev) : comm_(comm), dev_(dev) {}
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }

  done_work all_reduce(ddp::const_buffer send, ddp::mutable_buffer recv, ddp::reduce_op op) {
    auto [d_send, d_recv] = mirror(send, recv);
    auto w = comm_.all_reduce(d_send, d_recv, op);
    w.wait();
    back(recv, d_recv);
    return done_work(std::move(w));
  }
  done_work broadcast(ddp::mutable_buffer buf, int root) {
    auto d = to_device(buf.data, buf.bytes());
    auto w = comm_.broadcast({d.data(), buf.count, buf.type}, root);
    w.wait();
    back(buf, {d.data(), buf.count, buf.type});
    return done_work(std::move(w));
  }
  done_work all_gather(ddp::const_buffer send, ddp::mutable_buffer recv) {
    auto [d_send, d_recv] = mirror(send, recv);
    auto w = comm_.all_gather(d_send, d_recv);
    w.wait();
    back(recv, d_recv);
    return done_work(std::move(w));
  }
  done_work reduce_scatter(ddp::const_buffer send, ddp::mutable_buffer recv, ddp::reduce_op op) {
    // The larger buffer is send here: mirror it, and recv inside it when the host recv is.
    auto d = to_device(send.data, send.bytes());
    const auto offset = static_cast<const char*>(recv.data) - static_cast<const char*>(send.data);
    const bool inside = offset >= 0 && static_cast<std::size_t>(offset) + recv.bytes() <= send.bytes();
    ddp::cuda::device_vector<std::byte> own(dev_, inside ? 0 : recv.bytes());
    void* d_recv = inside ? static_cast<void*>(d.data() + offset) : own.data();
    auto w = comm_.reduce_scatter({d.data(), send.count, send.type}, {d_recv, recv.count, recv.type}, op);
    w.wait();
    back(recv, {d_recv, recv.count, recv.type});
    return done_work(std::move(w));
  }
  done_work barrier() {
    auto w = comm_.barrier();
    w.wait();
    return done_work(std::move(w));
  }
  void abort(const std::string& reason) { comm_.abort(reason); }

 private:
  ddp::cuda::device_vector<std::byte> to_device(const void* host, std::size_t bytes) {
    return ddp::cuda::device_vector<std::byte>::from_host(dev_, {static_cast<const std::byte*>(host), bytes});
  }
  void back(ddp::mutable_buffer host, ddp::mutable_buffer device) {
    dev_.copy_to_host(host.data, device.data, host.bytes());
  }

  // recv is the larger buffer (all_reduce: equal): send maps into it when the host send does.
  std::pair<ddp::const_buffer, ddp::mutable_buffer> mirror(ddp::const_buffer send, ddp::mutable_buffer recv) {
    scratch_recv_ = to_device(recv.data, recv.bytes());
    const auto offset = static_cast<const char*>(send.data) - static_cast<const char*>(recv.data);
    const bool inside = offset >= 0 && static_cast<std::size_t>(offset) + send.bytes() <= recv.bytes();
    if (!inside) scratch_send_ = to_device(send.data, send.bytes());
    const void* d_send = inside ? static_cast<const void*>(scratch_recv_.data() + offset) : scratch_send_.data();
    return {{d_send, send.count, send.type}, {scratch_recv_.data(), recv.count, recv.type}};
  }

  ddp::nccl::communicator& comm_;
  ddp::cuda::device& dev_;
  ddp::cuda::device_vector<std::byte> scratch_send_, scratch_recv_;
};

}  // namespace gpu_test
