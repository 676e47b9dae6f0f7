// The NCCL communicator on one GPU: the conformance suite (through host staging), ordering against
// the compute stream, the P3 check, the watchdog's timeout (and wait() never blocking the host),
// and a peer's failure reaching a rank through the host communicator. What one rank can and
// cannot check: tests/nccl/staged.hpp. The failure logic without a GPU: supervisor_test.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
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

// Holds the device's compute stream at a host function until open() (or the gate's end): work
// queued there afterwards, and collectives ordered after it, cannot start meanwhile. The host
// function keeps its own reference to the flag, so it may outlive the gate.
class stream_gate {
 public:
  explicit stream_gate(ddp::cuda::device& dev) {
    auto* held = new std::shared_ptr<std::atomic<bool>>(open_);
    dev.activate();
    const cudaError_t r = cudaLaunchHostFunc(dev.stream(), &hold, held);
    if (r != cudaSuccess) delete held;
    ddp::cuda::check(r, "cudaLaunchHostFunc", dev.site());
  }
  stream_gate(const stream_gate&) = delete;
  stream_gate& operator=(const stream_gate&) = delete;
  ~stream_gate() { open(); }
  void open() { open_->store(true); }

 private:
  static void CUDART_CB hold(void* p) {
    std::unique_ptr<std::shared_ptr<std::atomic<bool>>> held(static_cast<std::shared_ptr<std::atomic<bool>>*>(p));
    while (!(*held)->load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  std::shared_ptr<std::atomic<bool>> open_ = std::make_shared<std::atomic<bool>>(false);
};

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

// One rank reduces nothing (every op is a copy of its input), so this checks what one rank can:
// out of place, recv is written and send left as it was; the collective sees the compute stream's
// work queued before it (send doubled just before the call), and the work queued on the compute
// stream after wait() sees its result (recv tripled just after), for four collectives in flight
// at once (each op once), waited for in reverse order. 64 MiB each, so that wrong ordering shows:
// recv would hold 1, 3 or -3 times the input somewhere instead of 6 times.
TEST_CASE("nccl asynchronous all_reduce out of place on device buffers, ordered against the compute stream") {
  on_one_gpu([](auto&, ddp::nccl::communicator& comm, ddp::cuda::device& dev) {
    const std::size_t n = std::size_t{1} << 24;
    const ddp::reduce_op ops[] = {ddp::reduce_op::sum, ddp::reduce_op::avg, ddp::reduce_op::max, ddp::reduce_op::min};
    std::vector<ddp::cuda::device_vector<float>> sends, recvs;
    for (int b = 0; b < 4; ++b) {
      sends.push_back(ddp::cuda::device_vector<float>::from_host(dev, std::vector<float>(n, static_cast<float>(b + 1))));
      recvs.push_back(ddp::cuda::device_vector<float>::from_host(dev, std::vector<float>(n, -1.0f)));
    }
    std::vector<ddp::nccl::work> pending;
    for (std::size_t b = 0; b < 4; ++b) {
      dev.scale(sends[b].data(), n, 2.0f);  // queued just before: the collective must read 2 (b + 1)
      pending.push_back(comm.all_reduce({sends[b].data(), n, ddp::dtype::f32}, {recvs[b].data(), n, ddp::dtype::f32},
                                        ops[b]));
    }
    for (auto it = pending.rbegin(); it != pending.rend(); ++it) it->wait();
    for (std::size_t b = 0; b < 4; ++b) dev.scale(recvs[b].data(), n, 3.0f);  // must read the result
    for (std::size_t b = 0; b < 4; ++b) {
      INFO("buffer ", b, " (", std::string(ddp::name_of(ops[b])), ")");
      const auto expected = static_cast<float>(b + 1);
      const auto recv = recvs[b].to_host();
      const auto send = sends[b].to_host();
      CHECK(std::count(recv.begin(), recv.end(), 6.0f * expected) == static_cast<std::ptrdiff_t>(n));
      CHECK(std::count(send.begin(), send.end(), 2.0f * expected) == static_cast<std::ptrdiff_t>(n));
      CHECK(pending[b].test());
    }
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
// all_reduce of 16 GiB (a copy of about 8 ms on an H200) against a 1 ms timeout. The compute
// stream is held at a gate first, so the collective cannot start: wait() must return all the
// same (it only orders the compute stream; a wait() that blocked the host until the collective
// finished would never return before the gate opens), the collective must not be finished, and
// no timeout may fire while the stream has not reached it (50 timeouts' worth). Once the gate
// opens, the failure reaches the host through the work handle after the host synchronised with
// the GPU, and through every later collective.
TEST_CASE("a collective that runs past its timeout fails on the watchdog, naming it, and wait() never blocks the host") {
  ddp::nccl::options opts;
  opts.timeout = std::chrono::milliseconds(1);  // start-up has its own bound: options.init_timeout
  on_one_gpu(
      [](auto&, ddp::nccl::communicator& comm, ddp::cuda::device& dev) {
        const std::size_t n = std::size_t{4} << 30;  // floats: 16 GiB each way
        ddp::cuda::device_vector<float> send(dev, n), recv(dev, n);
        dev.synchronize();  // the allocations are done before the gate
        ddp::nccl::work w;
        {
          std::future<void> waited;  // before the gate: leaving the block opens the gate, then joins
          stream_gate gate(dev);
          // Queued and waited for on a thread of its own: a call that blocked the host until the
          // collective ran fails the case instead of hanging it.
          waited = std::async(std::launch::async, [&] {
            w = comm.all_reduce({send.data(), n, ddp::dtype::f32}, {recv.data(), n, ddp::dtype::f32},
                                ddp::reduce_op::sum);
            w.wait();
          });
          const bool returned = waited.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
          REQUIRE_MESSAGE(returned, "all_reduce() or wait() blocked the host while the collective could not run");
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          CHECK_FALSE(w.test());  // held behind the gate: not finished, and not failed
          CHECK_NOTHROW(w.rethrow_failure());
          gate.open();
          waited.get();  // joins it (it returns once the gate is open, even if it blocked)
        }
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

TEST_CASE("under on_failure::revoke a failure revokes NCCL (ncclCommRevoke), later collectives throw it, and a shrink "
          "that leaves nobody out or leaves the caller out is refused (ncclCommShrink itself needs two GPUs)") {
  ddp::nccl::options opts;
  opts.failure_action = ddp::nccl::options::on_failure::revoke;
  on_one_gpu(
      [](auto&, ddp::nccl::communicator& comm, ddp::cuda::device&) {
        comm.abort("a peer is gone");
        CHECK_THROWS_WITH_AS(comm.barrier(), doctest::Contains("a peer is gone"), ddp::peer_error);
        CHECK_THROWS_WITH(comm.shrink({}), doctest::Contains("no rank is excluded"));
        CHECK_THROWS_WITH(comm.shrink({0}), doctest::Contains("only the ranks that remain call shrink"));
        CHECK_THROWS_WITH(comm.shrink({1}), doctest::Contains("distinct ranks of the communicator"));
      },
      opts, /*aborts=*/true);
}
