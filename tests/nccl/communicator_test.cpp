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

TEST_CASE("a collective that cannot finish times out with its name, on the watchdog") {
  ddp::nccl::options opts;
  opts.timeout = std::chrono::milliseconds(300);
  on_one_gpu(
      [](auto&, ddp::nccl::communicator& comm, ddp::cuda::device& dev) {
        auto d = ddp::cuda::device_vector<float>::zeros(dev, 1024);
        // The compute stream is held for 2 s, so the reduction ordered after it cannot start.
        ddp::cuda::check(cudaLaunchHostFunc(dev.stream(), [](void*) { std::this_thread::sleep_for(std::chrono::seconds(2)); },
                                            nullptr),
                         "cudaLaunchHostFunc");
        auto w = comm.all_reduce({d.data(), d.size(), ddp::dtype::f32}, {d.data(), d.size(), ddp::dtype::f32},
                                 ddp::reduce_op::sum);
        try {
          w.wait();
          FAIL("no timeout");
        } catch (const ddp::timeout_error& e) {
          CHECK(contains(e.what(), "all_reduce #0"));
          CHECK(contains(e.what(), "made no progress for 300 ms"));
        }
        CHECK_THROWS_AS(comm.barrier(), ddp::peer_error);
        // Everything queued (the held stream, the aborted reduction) drains before `d` is freed.
        ddp::cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
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
