#pragma once
// A communicator that counts the bytes each rank sends, by kind of collective, as a ring
// algorithm moves them (nccl-tests' "bus bytes"): all_reduce 2(N-1)/N of its buffer,
// reduce_scatter and all_gather (N-1)/N of the larger buffer, broadcast the whole buffer. It
// forwards every call to the communicator it wraps.
#include <cstddef>
#include <string_view>

#include "ddp/concepts/communicator.hpp"

namespace test {

struct collective_bytes {
  double all_reduce = 0, reduce_scatter = 0, all_gather = 0, broadcast = 0;
  double total() const { return all_reduce + reduce_scatter + all_gather + broadcast; }
  collective_bytes operator-(const collective_bytes& o) const {
    return {all_reduce - o.all_reduce, reduce_scatter - o.reduce_scatter, all_gather - o.all_gather,
            broadcast - o.broadcast};
  }
};

template <ddp::communicator Inner>
class counting_communicator {
 public:
  static constexpr ddp::device_kind memory_kind = Inner::memory_kind;
  static constexpr std::string_view backend_name = Inner::backend_name;

  explicit counting_communicator(Inner& inner) : inner_(&inner) {}
  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }
  const collective_bytes& bytes() const noexcept { return bytes_; }
  std::size_t all_reduce_calls() const noexcept { return all_reduce_calls_; }
  std::size_t all_gather_calls() const noexcept { return all_gather_calls_; }

  auto all_reduce(ddp::const_buffer send, ddp::mutable_buffer recv, ddp::reduce_op op) {
    bytes_.all_reduce += 2.0 * ring() * static_cast<double>(send.bytes());
    ++all_reduce_calls_;
    return inner_->all_reduce(send, recv, op);
  }
  auto reduce_scatter(ddp::const_buffer send, ddp::mutable_buffer recv, ddp::reduce_op op) {
    bytes_.reduce_scatter += ring() * static_cast<double>(send.bytes());
    return inner_->reduce_scatter(send, recv, op);
  }
  auto all_gather(ddp::const_buffer send, ddp::mutable_buffer recv) {
    bytes_.all_gather += ring() * static_cast<double>(recv.count * ddp::size_of(recv.type));
    ++all_gather_calls_;
    return inner_->all_gather(send, recv);
  }
  auto broadcast(ddp::mutable_buffer buf, int root) {
    if (size() > 1) bytes_.broadcast += static_cast<double>(buf.count * ddp::size_of(buf.type));
    return inner_->broadcast(buf, root);
  }
  auto barrier() { return inner_->barrier(); }
  void abort(const std::string& reason) { inner_->abort(reason); }

 private:
  double ring() const { return static_cast<double>(size() - 1) / static_cast<double>(size()); }

  Inner* inner_;
  collective_bytes bytes_;
  std::size_t all_reduce_calls_ = 0;
  std::size_t all_gather_calls_ = 0;
};

}  // namespace test
