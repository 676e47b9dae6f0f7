// The NCCL communicator's failure logic without NCCL or a GPU (built into ddp_inproc_test, so it
// runs in every build and under the sanitizers): ddp::nccl::detail::supervisor, which the
// communicator runs NCCL under (include/ddp/nccl/supervisor.hpp), driven by a fake NCCL whose
// calls stay "in progress" for as long as a case says: a start-up or a collective that waits for
// a peer that never comes. Where the supervisor would hang, a case fails on a bounded wait
// instead, then releases the fake so that the thread ends.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/nccl/supervisor.hpp"
#include "why/verdict.hpp"

namespace nccl_supervisor_test {

namespace {

using namespace std::chrono_literals;
namespace nd = ddp::nccl::detail;
using steady = std::chrono::steady_clock;

// What the fake NCCL communicator says, shared between the test and the handle.
struct fake_nccl {
  // Calls and polls answer "in progress" until then (a peer that never joins: forever).
  std::atomic<steady::rep> busy_until{steady::time_point::max().time_since_epoch().count()};
  std::atomic<bool> release{false};  // a case gave up on a hung caller: everything finishes now
  std::atomic<bool> error{false};    // the next poll reports an error
  std::atomic<bool> live{false}, aborted{false}, revoked{false};
  std::atomic<int> polls{0};
  // After a revoke, how long until the communicator is quiescent (its collectives stopped).
  steady::duration quiesce = 50ms;

  void busy_for(steady::duration d) { busy_until = (steady::now() + d).time_since_epoch().count(); }
  void busy_forever() { busy_until = steady::time_point::max().time_since_epoch().count(); }
  nd::call_result answer() {
    ++polls;
    if (error) return {nd::call_state::failed, "unhandled system error (the fake's)"};
    if (release || steady::now().time_since_epoch().count() >= busy_until) return {nd::call_state::done, {}};
    return {nd::call_state::in_progress, {}};
  }
};

// The supervisor's Handle over the fake.
struct fake_handle {
  fake_nccl* nccl = nullptr;
  bool live() const noexcept { return nccl->live; }
  nd::call_result poll(const char*) const { return nccl->answer(); }
  void abort() noexcept {
    if (nccl->live.exchange(false)) nccl->aborted = true;
  }
  bool revoke() noexcept {
    nccl->revoked = true;
    nccl->busy_for(nccl->quiesce);
    return true;
  }
  nd::call_result finalize() { return {nd::call_state::done, {}}; }
  void destroy() noexcept { nccl->live = false; }
  // ncclCommInitRankConfig, or a collective, on a non-blocking communicator.
  nd::call_result init() {
    nccl->live = true;
    return call();
  }
  nd::call_result call() { return nccl->answer(); }
};

// The supervisor's Entry: a collective whose events the case sets.
struct fake_collective {
  fake_collective(const char* n, std::uint64_t s) : name(n), sequence(s) {}
  const char* name;
  std::uint64_t sequence;
  std::optional<nd::clock::time_point> seen_started;
  bool settling = false;
  std::atomic<bool> is_reached{false}, is_finished{false};
  bool reached() const { return is_reached; }
  bool finished() const { return is_finished; }
};

using supervisor = nd::supervisor<fake_handle, fake_collective>;

// The host channel: what this rank told its peers, and a peer's failure to report.
struct fake_peers {
  std::mutex mutex;
  std::vector<std::string> told;
  std::optional<std::pair<int, std::string>> failure;

  ddp::nccl::peer_channel channel() {
    return {[this](const std::string& what) {
              std::lock_guard lock(mutex);
              told.push_back(what);
            },
            [this] {
              std::lock_guard lock(mutex);
              return failure;
            }};
  }
  std::vector<std::string> seen() {
    std::lock_guard lock(mutex);
    return told;
  }
  void fail(int rank, std::string what) {
    std::lock_guard lock(mutex);
    failure.emplace(rank, std::move(what));
  }
};

// Runs f on a thread of its own and waits for it at most `bound`: a caller that hangs fails the
// case, and then the fake is released so that the thread ends. get() the result.
template <class F>
std::future<void> bounded(fake_nccl& nccl, F f, std::chrono::seconds bound = 10s) {
  auto done = std::async(std::launch::async, std::move(f));
  const bool in_time = done.wait_for(bound) == std::future_status::ready;
  CHECK_MESSAGE(in_time, "still waiting after ", bound.count(), " s: it hangs");
  if (!in_time) nccl.release = true;
  done.wait();
  return done;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A supervisor whose communicator has started (its start-up finished at once).
void start_now(supervisor& s, fake_nccl& nccl) {
  nccl.busy_for(0s);
  s.start([](fake_handle& h) { return h.init(); });
  nccl.busy_forever();
}

}  // namespace

TEST_CASE("nccl start-up is bounded by options.init_timeout, not by the collective timeout (a fake NCCL, no GPU)") {
  fake_nccl nccl;
  fake_peers peers;
  ddp::nccl::options opts;

  SUBCASE("a start-up that takes 100 times the collective timeout succeeds") {
    opts.timeout = 1ms;  // the 1 ms of the GPU suite's timeout case
    opts.init_timeout = 30s;
    supervisor s(0, "cuda:0", opts, peers.channel(), fake_handle{&nccl});
    nccl.busy_for(100ms);
    const auto begin = steady::now();
    auto started = bounded(nccl, [&] { s.start([](fake_handle& h) { return h.init(); }); });
    CHECK_NOTHROW(started.get());
    CHECK(steady::now() - begin >= 100ms);
    CHECK(nccl.live);
    CHECK_FALSE(nccl.aborted);
    CHECK(peers.seen().empty());
  }

  SUBCASE("a start-up that never finishes fails after init_timeout, naming the rank, the device and the option") {
    opts.timeout = 1h;  // were start-up bounded by it, this would hang
    opts.init_timeout = 100ms;
    supervisor s(3, "cuda:1", opts, peers.channel(), fake_handle{&nccl});
    const auto begin = steady::now();
    auto started = bounded(nccl, [&] { s.start([](fake_handle& h) { return h.init(); }); });
    try {
      started.get();
      FAIL("start-up succeeded");
    } catch (const ddp::error& e) {
      INFO(e.what());
      CHECK(contains(e.what(), "setting up the NCCL communicator on rank 3 (cuda:1) failed"));
      CHECK(contains(e.what(), "did not finish within 100 ms (ddp::nccl::options::init_timeout)"));
      CHECK(contains(e.what(), "raise options.init_timeout"));
      CHECK(e.operation() == "ncclCommInitRankConfig");
    }
    CHECK(steady::now() - begin >= 100ms);
    CHECK(nccl.aborted);
    const auto told = peers.seen();
    REQUIRE(told.size() == 1);
    CHECK(contains(told[0], "rank 3 (cuda:1)"));
  }

  SUBCASE("a peer that gave up ends start-up at once") {
    opts.init_timeout = 1h;
    supervisor s(0, "cuda:0", opts, peers.channel(), fake_handle{&nccl});
    peers.fail(2, "rank 2 failed: no GPU");
    auto started = bounded(nccl, [&] { s.start([](fake_handle& h) { return h.init(); }); });
    CHECK_THROWS_WITH(started.get(), doctest::Contains("rank 2 gave up: rank 2 failed: no GPU"));
    CHECK(nccl.aborted);
  }
}

TEST_CASE("a collective NCCL never finishes queueing ends in a timeout naming it, and cannot hang (a fake NCCL, no GPU)") {
  fake_nccl nccl;
  fake_peers peers;
  ddp::nccl::options opts;
  opts.timeout = 50ms;
  supervisor s(1, "cuda:1", opts, peers.channel(), fake_handle{&nccl});
  start_now(s, nccl);
  s.start_watching();
  // A peer never joins: the call stays in progress while NCCL connects, forever.
  auto e = std::make_shared<fake_collective>("all_reduce", 0);
  bool queued = false;
  auto submitted = bounded(nccl, [&] {
    s.submit(e, [](fake_handle& h) { return h.call(); }, [&] {
      queued = true;
      return true;
    });
  });
  try {
    submitted.get();
    FAIL("no timeout");
  } catch (const ddp::timeout_error& t) {
    INFO(t.what());
    CHECK(contains(t.what(), "all_reduce #0 on rank 1 made no progress for 50 ms"));
    CHECK(contains(t.what(), "still connecting to the peers"));
    CHECK(t.origin_rank() == 1);
  }
  CHECK_FALSE(queued);
  CHECK(nccl.aborted);
  CHECK(s.failed());
  CHECK_THROWS_AS(s.throw_if_failed("barrier"), ddp::timeout_error);
  const auto told = peers.seen();
  REQUIRE(told.size() == 1);
  CHECK(contains(told[0], "all_reduce #0"));
}

TEST_CASE("a peer's failure, abort() or NCCL's error ends a collective NCCL is still queueing (a fake NCCL, no GPU)") {
  fake_nccl nccl;
  fake_peers peers;
  ddp::nccl::options opts;
  opts.timeout = 1h;  // only the failure can end it
  supervisor s(0, "cuda:0", opts, peers.channel(), fake_handle{&nccl});
  start_now(s, nccl);
  s.start_watching();
  auto e = std::make_shared<fake_collective>("broadcast", 4);
  std::function<void()> failure;
  std::string expected;
  int origin = 0;
  std::size_t told = 1;
  SUBCASE("a peer's failure, heard on the host channel") {
    failure = [&] { peers.fail(2, "loss is NaN on rank 2"); };
    expected = "loss is NaN on rank 2";
    origin = 2;
    told = 0;  // the peer told everyone itself
  }
  SUBCASE("abort() on this rank") {
    failure = [&] { s.fail({0, "rank 0 failed: bad batch", false}, /*tell_peers=*/true); };
    expected = "rank 0 failed: bad batch";
  }
  SUBCASE("NCCL's error") {
    failure = [&] { nccl.error = true; };
    expected = "unhandled system error (the fake's)";  // found by the caller's poll or the watchdog's
  }
  std::thread later([&] {
    std::this_thread::sleep_for(30ms);
    failure();
  });
  auto submitted = bounded(nccl, [&] { s.submit(e, [](fake_handle& h) { return h.call(); }, [] { return true; }); });
  later.join();
  try {
    submitted.get();
    FAIL("no failure");
  } catch (const ddp::error& x) {
    INFO(x.what());
    CHECK(contains(x.what(), expected));
    CHECK(x.operation() == "broadcast");
    if (const auto* p = dynamic_cast<const ddp::peer_error*>(&x)) {
      CHECK(p->origin_rank() == origin);
      CHECK(dynamic_cast<const ddp::timeout_error*>(&x) == nullptr);
    }
  }
  CHECK(nccl.aborted);
  CHECK(s.failed());
  CHECK(peers.seen().size() == told);
}

TEST_CASE("a collective queued after NCCL settled it is timed from when its stream reaches it (a fake NCCL, no GPU)") {
  fake_nccl nccl;
  fake_peers peers;
  ddp::nccl::options opts;
  opts.timeout = 200ms;
  supervisor s(0, "cuda:0", opts, peers.channel(), fake_handle{&nccl});
  start_now(s, nccl);
  s.start_watching();
  auto e = std::make_shared<fake_collective>("all_gather", 7);
  nccl.busy_for(20ms);  // NCCL connects for a while, then queues it
  int queued = 0;
  auto submitted = bounded(nccl, [&] {
    s.submit(e, [](fake_handle& h) { return h.call(); }, [&] {
      ++queued;
      return true;
    });
  });
  CHECK_NOTHROW(submitted.get());
  CHECK(queued == 1);
  // Its stream has not reached it (compute ahead of it): however long that takes, no timeout.
  std::this_thread::sleep_for(2 * opts.timeout);
  CHECK_FALSE(s.failed());
  e->is_reached = true;  // now it runs, and never finishes: the GPU's clock times it out
  const auto deadline = steady::now() + 10s;
  while (!s.failed() && steady::now() < deadline) std::this_thread::sleep_for(1ms);
  REQUIRE(s.failed());
  try {
    s.throw_if_failed("barrier");
  } catch (const ddp::timeout_error& t) {
    INFO(t.what());
    CHECK(contains(t.what(), "all_gather #7 on rank 0 made no progress for 200 ms"));
    CHECK_FALSE(contains(t.what(), "still connecting"));
  }
  CHECK(nccl.aborted);
}

TEST_CASE("under on_failure::revoke a failure revokes NCCL instead of aborting it, and the ranks that remain shrink it "
          "once it is quiescent (a fake NCCL, no GPU)") {
  fake_nccl nccl;
  fake_peers peers;
  ddp::nccl::options opts;
  opts.timeout = 1h;
  opts.init_timeout = 5s;
  opts.failure_action = ddp::nccl::options::on_failure::revoke;
  supervisor s(1, "cuda:1", opts, peers.channel(), fake_handle{&nccl});
  start_now(s, nccl);
  s.start_watching();
  auto e = std::make_shared<fake_collective>("all_reduce", 9);
  std::thread later([&] {
    std::this_thread::sleep_for(30ms);
    peers.fail(2, "rank 2 failed: its process died");
  });
  auto submitted = bounded(nccl, [&] { s.submit(e, [](fake_handle& h) { return h.call(); }, [] { return true; }); });
  later.join();
  CHECK_THROWS_AS(submitted.get(), ddp::peer_error);
  CHECK(nccl.revoked);
  CHECK_FALSE(nccl.aborted);
  CHECK(nccl.live);
  // Revoked, it takes no collective.
  CHECK_THROWS_WITH_AS(s.submit(e, [](fake_handle& h) { return h.call(); }, [] { return true; }),
                       doctest::Contains("rank 2 failed: its process died"), ddp::peer_error);

  // The shrink runs once NCCL says the revoked communicator is quiescent, not before.
  SUBCASE("quiescent in time") {
    nccl.busy_for(80ms);
    const auto began = steady::now();
    std::optional<steady::duration> shrunk_after;
    fake_nccl child_nccl;
    child_nccl.busy_for(0s);  // its own start-up finishes at once
    supervisor child(1, "cuda:1", {}, peers.channel(), fake_handle{&child_nccl});
    bounded(nccl, [&] {
      child.start([&](fake_handle& h) {
        return s.when_quiescent("ncclCommShrink", [&](fake_handle&, bool) {
          shrunk_after = steady::now() - began;
          return h.init();
        });
      });
    }).get();
    REQUIRE(shrunk_after);
    CHECK(*shrunk_after >= 70ms);
    CHECK(child_nccl.live);
  }
  SUBCASE("NCCL reports its error: the shrink is told, to end the parent's operations first") {
    nccl.error = true;
    std::optional<bool> errored;
    bounded(nccl, [&] {
      s.when_quiescent("ncclCommShrink", [&](fake_handle&, bool e) {
        errored = e;
        return nd::call_result{};
      });
    }).get();
    REQUIRE(errored);
    CHECK(*errored);
  }
  SUBCASE("never quiescent: bounded by init_timeout") {
    nccl.quiesce = 1h;
    ddp::nccl::options short_opts = opts;
    short_opts.init_timeout = 100ms;
    supervisor impatient(1, "cuda:1", short_opts, peers.channel(), fake_handle{&nccl});
    // The same fake, revoked and never quiescent: a second supervisor over it, failed the same way.
    nccl.live = true;
    impatient.fail({1, "rank 1 failed: test", false});
    auto waited = bounded(nccl, [&] {
      impatient.when_quiescent("ncclCommShrink", [](fake_handle&, bool) { return nd::call_result{}; });
    });
    CHECK_THROWS_WITH(waited.get(), doctest::Contains("did not become quiescent within 100 ms"));
  }
}

TEST_CASE("a communicator that aborts on failure (the default) cannot be shrunk after one, and says why (a fake NCCL, "
          "no GPU)") {
  fake_nccl nccl;
  fake_peers peers;
  supervisor s(0, "cuda:0", {}, peers.channel(), fake_handle{&nccl});
  start_now(s, nccl);
  s.fail({0, "rank 0 failed: test", false});
  CHECK(nccl.aborted);
  CHECK_FALSE(nccl.revoked);
  CHECK_THROWS_WITH(s.when_quiescent("ncclCommShrink", [](fake_handle&, bool) { return nd::call_result{}; }),
                    doctest::Contains("on_failure::revoke"));
}

TEST_CASE("nccl: each rank's flight recorder dumps at the watchdog's timeout, and ddp-why names the rank that differs (a fake NCCL, no GPU)") {
  namespace fs = std::filesystem;
  namespace dc = ddp::comm;
  const fs::path dir = fs::temp_directory_path() / ("ddp_flight_nccl_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ddp::nccl::options opts;
  opts.timeout = 50ms;
  struct rank_state {
    fake_nccl nccl;
    fake_peers peers;
    std::optional<dc::flight_recorder> recorder;
    std::optional<supervisor> s;
  };
  std::vector<rank_state> ranks(3);
  for (int r = 0; r < 3; ++r) {
    auto& x = ranks[static_cast<std::size_t>(r)];
    x.recorder.emplace("nccl", r, 3, dc::recorder_options{.entries = 16, .dump_dir = dir.string(), .dump_on_signal = false});
    x.s.emplace(r, "cuda:" + std::to_string(r), opts, x.peers.channel(), fake_handle{&x.nccl}, &*x.recorder);
    start_now(*x.s, x.nccl);
    x.nccl.busy_for(0s);  // NCCL queues every call at once
    x.s->start_watching();
    // #0: the buffers' broadcast, finished on the GPU.
    std::shared_ptr<fake_collective> first;
    {
      dc::tag_scope buffers(dc::purpose::buffer_sync);
      first = std::make_shared<fake_collective>("broadcast", x.recorder->issued("broadcast", 16, ddp::dtype::f32, ddp::reduce_op::sum, 0));
    }
    first->is_reached = first->is_finished = true;
    x.s->submit(first, [](fake_handle& h) { return h.call(); }, [] { return true; });
    // #1: step 1, bucket 1's gradients; rank 2 reduces 12 floats where the others reduce 16, so
    // the collective never finishes on the GPU.
    dc::step_scope step(1);
    dc::tag_scope bucket(dc::purpose::gradients, 1);
    const std::size_t count = r == 2 ? 12 : 16;
    auto second = std::make_shared<fake_collective>("all_reduce", x.recorder->issued("all_reduce", count, ddp::dtype::f32, ddp::reduce_op::avg));
    second->is_reached = true;
    x.s->submit(second, [](fake_handle& h) { return h.call(); }, [] { return true; });
  }
  for (auto& x : ranks) {
    for (int i = 0; i < 500 && !x.s->failed(); ++i) std::this_thread::sleep_for(10ms);
    CHECK(x.s->failed());
  }
  // A supervisor is failed before its recorder's dump is in place (fail() dumps after setting the
  // latch, on the watchdog's thread): each rank's file is waited for, as a reader of a job would.
  for (int r = 0; r < 3; ++r) {
    const fs::path dump = dir / ("nccl.rank" + std::to_string(r) + ".jsonl");
    for (int i = 0; i < 500 && !fs::exists(dump); ++i) std::this_thread::sleep_for(10ms);
  }
  const auto v = ddp::why::judge_folder(dir, "nccl");
  INFO(v.text);
  CHECK(v.status == ddp::why::differ);
  REQUIRE(v.sequence.has_value());
  CHECK(*v.sequence == 1);
  CHECK(v.kind == "count");
  CHECK(v.odd == std::vector<int>{2});
  REQUIRE(v.sides.size() == 2);
  CHECK(v.sides[0].ranks == std::vector<int>{0, 1});
  CHECK(v.sides[1].call->tag() == "step 1, bucket 1, gradients");
  CHECK(v.sides[1].call->state == "started");
  for (int r = 0; r < 3; ++r) {
    REQUIRE(v.last_completed.at(r).has_value());
    CHECK(v.last_completed.at(r)->op == "broadcast");
  }
  CHECK(contains(v.text, "made no progress for 50 ms"));
  ranks.clear();
  fs::remove_all(dir);
}

}  // namespace nccl_supervisor_test
