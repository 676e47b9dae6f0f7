// Each concept accepts the library's models and rejects a type missing one member.
#include <doctest/doctest.h>

#include <vector>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/module.hpp"
#include "ddp/host/device.hpp"
#include "ddp/inproc/communicator.hpp"
#include "support/minimal_module.hpp"

namespace concepts_test {

namespace {

struct complete_comm {
  static constexpr ddp::device_kind memory_kind = ddp::device_kind::cpu;
  static constexpr std::string_view backend_name = "test";
  int rank() const { return 0; }
  int size() const { return 1; }
  ddp::comm::work all_reduce(ddp::const_buffer, ddp::mutable_buffer, ddp::reduce_op) { return {}; }
  ddp::comm::work broadcast(ddp::mutable_buffer, int) { return {}; }
  ddp::comm::work all_gather(ddp::const_buffer, ddp::mutable_buffer) { return {}; }
  ddp::comm::work reduce_scatter(ddp::const_buffer, ddp::mutable_buffer, ddp::reduce_op) { return {}; }
  ddp::comm::work barrier() { return {}; }
  void abort(const std::string&) {}
};
struct comm_without_rank : complete_comm {
  int rank() = delete;
};
struct comm_without_barrier : complete_comm {
  void barrier() = delete;
};
struct comm_with_blocking_all_reduce : complete_comm {
  void all_reduce(ddp::const_buffer, ddp::mutable_buffer, ddp::reduce_op) {}
};

using complete_module = test::minimal_module;
struct module_without_buffers : complete_module {
  void buffers() = delete;
};
struct module_with_plain_backward : complete_module {
  void backward(const output_type&) {}
  void backward(const output_type&, const ddp::ready_sink&) = delete;
};
struct module_silent : complete_module {
  static constexpr bool reports_gradient_ready = false;
};
struct module_reporting : complete_module {
  static constexpr bool reports_gradient_ready = true;
  void bind_gradient(std::size_t, float*) {}
};
struct module_reporting_at_run_time : complete_module {
  bool reports_gradient_ready = true;  // not a constant: reports nothing, and is no hard error
};

struct device_without_locate : ddp::host::device {
  void locate(const void*) = delete;
};

}  // namespace

TEST_CASE("host work handles carry timing, a handle without it is still a work handle") {
  static_assert(ddp::timed_work_handle<ddp::comm::work>);
  struct untimed {
    void wait() {}
    bool test() { return true; }
  };
  static_assert(ddp::work_handle<untimed> && !ddp::timed_work_handle<untimed>);
  CHECK(ddp::timed_work_handle<ddp::comm::work>);
}

TEST_CASE("communicator concept") {
  static_assert(ddp::communicator<ddp::inproc::communicator>);
  static_assert(ddp::communicator<complete_comm>);
  static_assert(!ddp::communicator<comm_without_rank>);
  static_assert(!ddp::communicator_requirements::has_rank<comm_without_rank>);
  static_assert(!ddp::communicator<comm_without_barrier>);
  static_assert(!ddp::communicator_requirements::has_barrier<comm_without_barrier>);
  static_assert(!ddp::communicator<comm_with_blocking_all_reduce>);
  CHECK(ddp::communicator<complete_comm>);
}

TEST_CASE("module concept and its optional capabilities") {
  static_assert(ddp::trainable_module<complete_module>);
  static_assert(!ddp::trainable_module<module_without_buffers>);
  static_assert(!ddp::module_requirements::has_buffers<module_without_buffers>);
  static_assert(!ddp::trainable_module<module_with_plain_backward>);
  static_assert(ddp::reports_gradient_ready<complete_module>);
  static_assert(!ddp::reports_gradient_ready<module_silent>);  // the capability is declared, not inferred
  static_assert(ddp::reports_gradient_ready<module_reporting>);
  static_assert(!ddp::reports_gradient_ready<module_reporting_at_run_time>);
  static_assert(!ddp::binds_gradient_storage<complete_module>);
  static_assert(ddp::binds_gradient_storage<module_reporting>);
  CHECK(ddp::trainable_module<complete_module>);
}

TEST_CASE("device concept") {
  static_assert(ddp::device<ddp::host::device>);
  static_assert(!ddp::device<device_without_locate>);
  static_assert(!ddp::device_requirements::has_queue<device_without_locate>);
  CHECK(ddp::device<ddp::host::device>);
}

}  // namespace concepts_test
