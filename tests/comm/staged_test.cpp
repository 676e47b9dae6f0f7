// ddp::comm::staged_communicator (several ranks on one GPU) over the host device, where its copies are
// memcpy: the conformance suite passes through it, and a trainer over it takes the bits of one
// over the in-process communicator it wraps. tests/trainer/gpu_trainer_test.cpp runs it on a GPU.
#include <doctest/doctest.h>

#include "../conformance/communicator_suite.hpp"
#include "ddp/comm/checked_communicator.hpp"
#include "ddp/comm/staged_communicator.hpp"
#include "ddp/host/device.hpp"
#include "ddp/inproc/launch.hpp"
#include "trainer/equivalence.hpp"

namespace comm_staged_test {

namespace {
using staged = ddp::comm::staged_communicator<ddp::inproc::communicator, ddp::host::device>;
static_assert(ddp::diagnose_communicator<staged>());
static_assert(staged::memory_kind == ddp::device_kind::cpu);

template <class F>
void on_staged_ranks(int world, F f) {
  ddp::inproc::launch(world, [&](ddp::inproc::communicator& host) {
    ddp::host::device dev;
    staged comm(host, dev);
    f(comm);
  });
}
}  // namespace

TEST_CASE("staged_communicator passes the conformance suite: all_reduce, broadcast, all_gather, reduce_scatter") {
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    on_staged_ranks(world, [](staged& comm) {
      conformance::all_reduce_cases(comm);
      conformance::broadcast_cases(comm);
      conformance::all_gather_cases(comm);
      conformance::reduce_scatter_cases(comm);
    });
  }
}

TEST_CASE_TEMPLATE("a trainer over staged_communicator takes the bits of one over the communicator it wraps", Update,
                   ddp::update::replicated, ddp::update::sharded) {
  using namespace equivalence;
  using detect = ddp::unused_params::detect_each_step;
  using sync = ddp::buffer_sync::broadcast_once_per_step;
  for (int world : {2, 3}) {
    CAPTURE(world);
    const auto plain = ddp::inproc::launch(world, [](ddp::inproc::communicator& comm) {
      return run_rank<sync, detect, ddp::inproc::communicator, Update>(comm, shape::two_micro_batches).params;
    });
    const auto through_host = ddp::inproc::launch(world, [](ddp::inproc::communicator& host) {
      ddp::host::device dev;
      staged comm(host, dev);
      return run_rank<sync, detect, staged, Update>(comm, shape::two_micro_batches).params;
    });
    CHECK(through_host == plain);
  }
}

TEST_CASE_TEMPLATE("a trainer in the checking mode takes the bits of one without it (no false mismatch)", Update,
                   ddp::update::replicated, ddp::update::sharded) {
  using namespace equivalence;
  using detect = ddp::unused_params::detect_each_step;
  using sync = ddp::buffer_sync::broadcast_once_per_step;
  using checked = ddp::comm::checked_communicator<ddp::inproc::communicator>;
  const int world = 3;
  const auto plain = ddp::inproc::launch(world, [](ddp::inproc::communicator& comm) {
    return run_rank<sync, detect, ddp::inproc::communicator, Update>(comm, shape::two_micro_batches).params;
  });
  const auto agreed = ddp::inproc::launch(world, [](ddp::inproc::communicator& inner) {
    checked comm(inner);
    return run_rank<sync, detect, checked, Update>(comm, shape::two_micro_batches).params;
  });
  CHECK(agreed == plain);
}

TEST_CASE("a staged collective that fails returns a work whose wait() throws the failure") {
  // A root outside the world: the in-process communicator refuses it, the staged work carries
  // that to wait(), and the world's failure ends the launch with it.
  CHECK_THROWS_WITH_AS(ddp::inproc::launch(2,
                                           [](ddp::inproc::communicator& host) {
                                             ddp::host::device dev;
                                             staged comm(host, dev);
                                             std::vector<float> v(4, 1.0f);
                                             auto w = comm.broadcast(ddp::mutable_buffer{v.data(), v.size(), ddp::dtype::f32}, 7);
                                             CHECK(w.test());
                                             CHECK_THROWS_WITH_AS(w.wait(), doctest::Contains("root 7 is not a rank"), ddp::error);
                                           }),
                       doctest::Contains("root 7 is not a rank"), std::exception);
}

}  // namespace comm_staged_test
