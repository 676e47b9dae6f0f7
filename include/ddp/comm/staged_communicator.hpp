#pragma once
// A communicator over a device's memory built from a host communicator (in-process threads, MPI
// processes): each collective copies its buffers from the device to host memory, runs the host
// communicator's collective there, and copies the result back onto the device's queue.
//
// What it is for: several ranks on one GPU. NCCL refuses two ranks on one device, so without it
// the trainer's multi-rank logic on a GPU (buckets, a shard that does not start at 0, buffer
// sync, unused-parameter detection) could only run with one GPU per rank:
//
//   ddp::inproc::launch(2, [&](ddp::inproc::communicator& host) {
//     ddp::cuda::device dev(0);                                   // both ranks on GPU 0
//     Model model = make_model(dev);                              // each rank its own
//     ddp::comm::staged_communicator<ddp::inproc::communicator, ddp::cuda::device> comm(host, dev);
//     ddp::trainer<Model, ddp::use_communicator<decltype(comm)>, ddp::use_device<ddp::cuda::device>>
//         trainer(model, comm, dev, opt);
//   });
//
// Each collective is blocking (it returns a finished work handle; a failure is rethrown by its
// wait(), as the contract asks): two copies through the host per collective and no overlap with
// compute, so it is a way to run and test, not to train fast. Over the host device the copies
// are memcpy, which is how the tests check it on a machine without a GPU. Its collectives are
// recorded by the host communicator's flight recorder (recorder()).
#include <cstddef>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/core/buffer.hpp"
#include "ddp/core/dtype.hpp"

namespace ddp::comm {

// A collective that has already run; wait() rethrows its failure, if any.
class staged_work {
 public:
  staged_work() = default;
  explicit staged_work(std::exception_ptr failure) : failure_(std::move(failure)) {}
  void wait() {
    if (failure_) std::rethrow_exception(failure_);
  }
  bool test() const noexcept { return true; }

 private:
  std::exception_ptr failure_;
};

template <communicator Host, device Device>
class staged_communicator {
  static_assert(Host::memory_kind == device_kind::cpu,
                "ddp: staged_communicator stages through host memory: its inner communicator must take host "
                "buffers (ddp::inproc::communicator, ddp::mpi::communicator)");

 public:
  static constexpr device_kind memory_kind = Device::kind;
  static constexpr std::string_view backend_name = "staged";

  staged_communicator(Host& host, Device& device) : host_(&host), device_(&device) {}

  int rank() const { return host_->rank(); }
  int size() const { return host_->size(); }
  Host& host() noexcept { return *host_; }
  // The flight recorder (comm/flight_recorder.hpp): the host communicator's, which runs each of
  // this one's collectives, one for one and in order, under the tag of the thread that issued it.
  auto& recorder() noexcept
    requires requires(Host& h) { h.recorder(); }
  {
    return host_->recorder();
  }

  staged_work all_reduce(const_buffer send, mutable_buffer recv, reduce_op op) {
    return run([&] {
      const bool in_place = send.data == recv.data;
      void* in = stage_in(send_, send);
      void* out = in_place ? in : room(recv_, recv);
      host_->all_reduce(const_buffer{in, send.count, send.type}, mutable_buffer{out, recv.count, recv.type}, op).wait();
      stage_out(recv, out);
    });
  }
  staged_work broadcast(mutable_buffer buf, int root) {
    return run([&] {
      void* h = stage_in(send_, const_buffer{buf.data, buf.count, buf.type});
      host_->broadcast(mutable_buffer{h, buf.count, buf.type}, root).wait();
      stage_out(buf, h);
    });
  }
  staged_work all_gather(const_buffer send, mutable_buffer recv) {
    return run([&] {
      void* in = stage_in(send_, send);
      void* out = room(recv_, recv);
      host_->all_gather(const_buffer{in, send.count, send.type}, mutable_buffer{out, recv.count, recv.type}).wait();
      stage_out(recv, out);
    });
  }
  staged_work reduce_scatter(const_buffer send, mutable_buffer recv, reduce_op op) {
    return run([&] {
      void* in = stage_in(send_, send);
      void* out = room(recv_, recv);
      host_->reduce_scatter(const_buffer{in, send.count, send.type}, mutable_buffer{out, recv.count, recv.type}, op)
          .wait();
      stage_out(recv, out);
    });
  }
  staged_work barrier() {
    return run([&] { host_->barrier().wait(); });
  }
  void abort(const std::string& reason) { host_->abort(reason); }

 private:
  template <class F>
  staged_work run(F f) {
    try {
      f();
      return {};
    } catch (...) {
      return staged_work(std::current_exception());
    }
  }
  // Host memory for `b` (grown, never shrunk: one collective at a time uses it).
  static void* room(std::vector<std::byte>& staging, const auto& b) {
    const std::size_t bytes = b.count * size_of(b.type);
    if (staging.size() < bytes) staging.resize(bytes);
    return staging.data();
  }
  // The device's queue is drained up to here: copy_to_host returns when the copy is done.
  void* stage_in(std::vector<std::byte>& staging, const_buffer b) {
    void* h = room(staging, b);
    if (b.count) device_->copy_to_host(h, b.data, b.count * size_of(b.type));
    return h;
  }
  // Queued on the device: the work issued after this collective sees the result.
  void stage_out(mutable_buffer b, const void* h) {
    if (b.count) device_->copy_from_host(b.data, h, b.count * size_of(b.type));
  }

  Host* host_;
  Device* device_;
  std::vector<std::byte> send_, recv_;
};

}  // namespace ddp::comm
