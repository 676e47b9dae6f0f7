#pragma once
// The NCCL communicator seen through host memory, so the conformance suite (written for host
// buffers) runs on it unchanged: each collective copies its buffers to the GPU, runs there, and
// copies the result back. In-place forms map to in-place forms on the GPU.
#include <cstring>

#include "ddp/cuda/device_vector.hpp"
#include "ddp/nccl/communicator.hpp"

namespace gpu_test {

struct done_work {
  void wait() const {}
  bool test() const { return true; }
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
    comm_.all_reduce(d_send, d_recv, op).wait();
    back(recv, d_recv);
    return {};
  }
  done_work broadcast(ddp::mutable_buffer buf, int root) {
    auto d = to_device(buf.data, buf.bytes());
    comm_.broadcast({d.data(), buf.count, buf.type}, root).wait();
    back(buf, {d.data(), buf.count, buf.type});
    return {};
  }
  done_work all_gather(ddp::const_buffer send, ddp::mutable_buffer recv) {
    auto [d_send, d_recv] = mirror(send, recv);
    comm_.all_gather(d_send, d_recv).wait();
    back(recv, d_recv);
    return {};
  }
  done_work reduce_scatter(ddp::const_buffer send, ddp::mutable_buffer recv, ddp::reduce_op op) {
    // The larger buffer is send here: mirror it, and recv inside it when the host recv is.
    auto d = to_device(send.data, send.bytes());
    const auto offset = static_cast<const char*>(recv.data) - static_cast<const char*>(send.data);
    const bool inside = offset >= 0 && static_cast<std::size_t>(offset) + recv.bytes() <= send.bytes();
    ddp::cuda::device_vector<std::byte> own(dev_, inside ? 0 : recv.bytes());
    void* d_recv = inside ? static_cast<void*>(d.data() + offset) : own.data();
    comm_.reduce_scatter({d.data(), send.count, send.type}, {d_recv, recv.count, recv.type}, op).wait();
    back(recv, {d_recv, recv.count, recv.type});
    return {};
  }
  done_work barrier() {
    comm_.barrier().wait();
    return {};
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
