// expect: the communicator lacks `int rank\(\) const`
#include <ddp/concepts/communicator.hpp>
#include <ddp/comm/progress_thread.hpp>

struct no_rank {
  static constexpr ddp::device_kind memory_kind = ddp::device_kind::cpu;
  static constexpr std::string_view backend_name = "test";
  int size() const { return 1; }
  ddp::comm::work all_reduce(ddp::const_buffer, ddp::mutable_buffer, ddp::reduce_op) { return {}; }
  ddp::comm::work broadcast(ddp::mutable_buffer, int) { return {}; }
  ddp::comm::work all_gather(ddp::const_buffer, ddp::mutable_buffer) { return {}; }
  ddp::comm::work reduce_scatter(ddp::const_buffer, ddp::mutable_buffer, ddp::reduce_op) { return {}; }
  ddp::comm::work barrier() { return {}; }
  void abort(const std::string&) {}
};
static_assert(ddp::diagnose_communicator<no_rank>());
int main() {}
