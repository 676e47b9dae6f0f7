// The NCCL communicator on one GPU: the conformance suite (through host staging), the P3 check,
// the watchdog's timeout, and a peer's failure reaching a rank through the host communicator.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "conformance/communicator_suite.hpp"
#include "ddp/inproc/launch.hpp"
#include "nccl/staged.hpp"

namespace {

// Runs f on one in-process rank with a NCCL communicator on GPU 0. A case that aborts on
// purpose sets `aborts`: the launch's closing barrier then reports that abort, as it should.
template <class F>
void on_one_gpu(F f, ddp::nccl::options opts = {}, bool aborts = false) {
  try {
    ddp::inproc::launch(1, [&](ddp::inproc::communicator& host) {
      ddp::cuda::device dev(0, host.rank());
      auto comm = ddp::nccl::bootstrap(host, dev, opts);
      f(host, comm, dev);
    });
  } catch (const ddp::inproc::launch_error& e) {  // the rank's own error is nested in it
    if (!aborts) throw;
    try {
      std::rethrow_if_nested(e);
    } catch (const ddp::peer_error&) {  // the abort, reported by the launch's closing barrier
    }
  }
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("a GPU is present (this suite fails rather than skips without one)") {
  CHECK(ddp::cuda::device_count() >= 1);
}

TEST_CASE("nccl conformance suite on one GPU") {
  on_one_gpu([](auto&, ddp::nccl::communicator& comm, ddp::cuda::device& dev) {
    gpu_test::staged s(comm, dev);
    conformance::all_reduce_cases(s);
    conformance::broadcast_cases(s);
    conformance::all_gather_cases(s);
    conformance::reduce_scatter_cases(s);
    conformance::half_cases(s);
    conformance::async_cases(s);
    CHECK(conformance::determinism_case(s) == conformance::determinism_case(s));
  });
}

TEST_CASE("nccl asynchronous all_reduce on device buffers, waited in reverse order") {
  on_one_gpu([](auto&, ddp::nccl::communicator& comm, ddp::cuda::device& dev) {
    std::vector<ddp::cuda::device_vector<float>> bufs;
    std::vector<ddp::nccl::work> pending;
    for (int b = 0; b < 4; ++b) {
      std::vector<float> host(1 << 20, static_cast<float>(b));
      bufs.push_back(ddp::cuda::device_vector<float>::from_host(dev, host));
      auto& d = bufs.back();
      pending.push_back(comm.all_reduce({d.data(), d.size(), ddp::dtype::f32}, {d.data(), d.size(), ddp::dtype::f32},
                                        ddp::reduce_op::sum));
    }
    for (auto it = pending.rbegin(); it != pending.rend(); ++it) it->wait();
    for (int b = 0; b < 4; ++b) CHECK(bufs[static_cast<std::size_t>(b)].to_host()[12345] == static_cast<float>(b));
  });
}

TEST_CASE("nccl rejects a host buffer, naming it and both devices (P3)") {
  on_one_gpu([](auto&, ddp::nccl::communicator& comm, ddp::cuda::device&) {
    std::vector<float> host(16, 1.0f);
    try {
      comm.all_reduce({host.data(), host.size(), ddp::dtype::f32}, {host.data(), host.size(), ddp::dtype::f32},
                      ddp::reduce_op::sum);
      FAIL("no error");
    } catch (const ddp::error& e) {
      CHECK(contains(e.what(), "the send buffer lives on cpu"));
      CHECK(contains(e.what(), "bound to cuda:0"));
      CHECK(contains(e.what(), "P3"));
    }
  });
}

// The watchdog's clock starts when the GPU reaches the collective. On one rank nothing waits
// for a peer, so a collective that outlasts the timeout is a long one: an out-of-place
// all_reduce of 16 GiB (a copy of about 8 ms on an H200) against a 1 ms timeout. wait() only
// orders the compute stream and does not block; the failure reaches the host through the work
// handle once the host has synchronised with the GPU, and through every later collective.
TEST_CASE("a collective that runs past its timeout fails on the watchdog, naming it, and wait() never blocks the host") {
  ddp::nccl::options opts;
  opts.timeout = std::chrono::milliseconds(1);
  on_one_gpu(
      [](auto&, ddp::nccl::communicator& comm, ddp::cuda::device& dev) {
        const std::size_t n = std::size_t{4} << 30;  // floats: 16 GiB each way
        ddp::cuda::device_vector<float> send(dev, n), recv(dev, n);
        auto w = comm.all_reduce({send.data(), n, ddp::dtype::f32}, {recv.data(), n, ddp::dtype::f32},
                                 ddp::reduce_op::sum);
        const auto before = dev.host_waits();
        w.wait();
        CHECK(dev.host_waits() == before);
        dev.synchronize();  // the aborted collective completes on the stream
        try {
          w.rethrow_failure();
          FAIL("no timeout");
        } catch (const ddp::timeout_error& e) {
          CHECK(contains(e.what(), "all_reduce #0"));
          CHECK(contains(e.what(), "made no progress for 1 ms"));
        }
        CHECK_THROWS_AS(comm.barrier(), ddp::timeout_error);
      },
      opts, /*aborts=*/true);
}

TEST_CASE("a failure reported through the host communicator reaches the NCCL communicator") {
  ddp::nccl::options opts;
  opts.timeout = std::chrono::milliseconds(500);  // the watchdog polls every 50 ms
  std::string seen;
  on_one_gpu(
        [&](ddp::inproc::communicator& host, ddp::nccl::communicator& comm, ddp::cuda::device&) {
          host.abort("loss is NaN");
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
          while (std::chrono::steady_clock::now() < deadline) {
            try {
              comm.barrier().wait();
            } catch (const ddp::peer_error& e) {
              seen = e.what();
              CHECK(e.origin_rank() == 0);
              break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          }
      },
      opts, /*aborts=*/true);
  CHECK(contains(seen, "loss is NaN"));
}

TEST_CASE("abort() fails every later collective on this rank, naming the reason") {
  on_one_gpu(
      [](auto&, ddp::nccl::communicator& comm, ddp::cuda::device&) {
        comm.abort("bad batch");
        try {
          comm.barrier();
          FAIL("no error");
        } catch (const ddp::peer_error& e) {
          CHECK(contains(e.what(), "bad batch"));
        }
      },
      {}, /*aborts=*/true);
}

// Needs no GPU: NCCL's error strings are host code.
TEST_CASE("ncclInvalidUsage hints two ranks on one GPU only where a communicator is created") {
  const auto at_init = ddp::nccl::describe(ncclInvalidUsage, nullptr, "ncclCommInitRankConfig");
  const auto in_call = ddp::nccl::describe(ncclInvalidUsage, nullptr, "all_reduce");
  CHECK(at_init.find("two ranks on one GPU") != std::string::npos);
  CHECK(in_call.find("two ranks on one GPU") == std::string::npos);
  CHECK(in_call.find("rejected an argument") != std::string::npos);
}
