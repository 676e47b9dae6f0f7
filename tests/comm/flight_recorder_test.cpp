// The flight recorder (ddp/comm/flight_recorder.hpp), ddp-why's verdict on its dumps
// (src/why/verdict.hpp) and the checking mode (ddp/comm/checked_communicator.hpp), on in-process
// ranks: each kind of mismatch injected on one rank of three is named, with the right rank,
// sequence id and tag, by the verdict and by the checking mode's error on every rank. And the
// trainer's agreement on its policies: a one_of selected differently per rank, or trainers of
// different policy lists, are one error on every rank naming the slot and each side.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/checked_communicator.hpp"
#include "ddp/comm/flight_recorder.hpp"
#include "ddp/inproc/launch.hpp"
#include "support/mismatch.hpp"
#include "why/verdict.hpp"

namespace flight_recorder_test {

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
namespace dc = ddp::comm;
using mismatch::injected;
using mismatch::injections;
using mismatch::issue_first_step;
using mismatch::issue_steps;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// An empty folder of its own for one case's dumps.
fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("ddp_flight_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

ddp::inproc::options recorded(const fs::path& dir, std::size_t entries = 2000) {
  ddp::inproc::options o;
  o.timeout = 2s;
  o.recorder = dc::recorder_options{.entries = entries, .dump_dir = dir.string(), .dump_on_signal = false};
  return o;
}

}  // namespace

TEST_CASE("flight recorder: the ring keeps the newest entries, with their tags and states") {
  dc::flight_recorder rec("inproc", 0, 1, dc::recorder_options{.entries = 4, .dump_dir = {}, .dump_on_signal = false});
  for (int i = 0; i < 10; ++i) {
    dc::step_scope step(i);
    dc::tag_scope t(dc::purpose::gradients, i % 3);
    const auto s = rec.issued("all_reduce", 100 + i, ddp::dtype::f32, ddp::reduce_op::avg);
    CHECK(s == static_cast<std::uint64_t>(i));
    if (i != 9) rec.started(s);
    if (i < 8) rec.completed(s);
  }
  const auto e = rec.entries();
  REQUIRE(e.size() == 4);
  CHECK(e.front().sequence == 6);
  CHECK(e.back().sequence == 9);
  CHECK(e[0].count == 106);
  CHECK(e[0].tag == dc::collective_tag{6, 0, dc::purpose::gradients});
  CHECK(e[1].state == dc::collective_state::completed);
  CHECK(e[2].state == dc::collective_state::started);
  CHECK(e[3].state == dc::collective_state::issued);
  CHECK(dc::current_tag() == dc::collective_tag{});  // the scopes restored the thread's tag

  dc::flight_recorder off("inproc", 0, 1, dc::recorder_options{.entries = 0, .dump_dir = {}, .dump_on_signal = false});
  CHECK(off.issued("barrier", 0, ddp::dtype::u8) == 0);
  CHECK(off.issued("barrier", 0, ddp::dtype::u8) == 1);  // ids still count: they match the other ranks'
  CHECK(off.entries().empty());
}

TEST_CASE("flight recorder: dumps written by many threads at once are whole, and read back") {
  const auto dir = fresh_dir("concurrent");
  dc::flight_recorder rec("inproc", 1, 2, dc::recorder_options{.entries = 64, .dump_dir = dir.string(), .dump_on_signal = false});
  REQUIRE(rec.dump("first"));
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; !stop; ++i) {
      const auto s = rec.issued("all_reduce", i, ddp::dtype::f32);
      rec.started(s);
      rec.completed(s);
    }
  });
  std::vector<std::thread> dumpers;
  for (int t = 0; t < 3; ++t)
    dumpers.emplace_back([&] {
      for (int i = 0; i < 20; ++i) CHECK(rec.dump("dump \"" + std::to_string(i) + "\"\n"));
    });
  for (int i = 0; i < 20; ++i) {
    std::optional<ddp::why::dump> d;
    CHECK_NOTHROW(d = ddp::why::read_dump(rec.dump_path()));  // throws on a cut or mixed file
    CHECK((d && d->rank == 1 && d->world == 2));
  }
  for (auto& t : dumpers) t.join();
  stop = true;
  writer.join();
  const auto d = ddp::why::read_dump(rec.dump_path());
  CHECK(contains(d.reason, "dump \""));
  CHECK(d.entries.size() == 64);
  fs::remove_all(dir);
}

TEST_CASE("flight recorder: each injected mismatch is named by ddp-why's verdict and by the checking mode") {
  for (const auto& inj : injections) {
    CAPTURE(inj.kind);
    CAPTURE(inj.odd_issue);
    const auto dir = fresh_dir(std::string("inject_") + inj.kind + std::to_string(static_cast<int>(inj.what)));

    // Unchecked: every rank fails (the in-process world sees the mismatch, or times out) and dumps.
    CHECK_THROWS(ddp::inproc::launch(3, [&](ddp::inproc::communicator& comm) { issue_steps(comm, inj.what); },
                                     recorded(dir)));
    const auto v = ddp::why::judge_folder(dir, "inproc");
    INFO(v.text);
    CHECK(v.status == ddp::why::differ);
    REQUIRE(v.sequence.has_value());
    CHECK(*v.sequence == 2);
    CHECK(v.kind == inj.kind);
    CHECK(v.odd == std::vector<int>{2});
    REQUIRE(v.sides.size() == 2);
    CHECK(v.sides[0].ranks == std::vector<int>{0, 1});
    REQUIRE(v.sides[0].call.has_value());
    CHECK(v.sides[0].call->tag() == "step 1, bucket 1, gradients");
    REQUIRE(v.sides[1].call.has_value());
    CHECK(contains(v.sides[1].call->describe(), inj.odd_issue));
    CHECK(v.last_completed.at(0)->seq == 1);
    CHECK(v.last_completed.at(2)->seq == 1);
    CHECK(contains(v.text, "first difference: collective #2, kind: " + std::string(inj.kind)));

    // Checked: every rank throws the same error naming rank 2, #2 and both sides' tags, and its
    // dumps give the same verdict.
    const auto checked_dir = fresh_dir(std::string("checked_") + inj.kind + std::to_string(static_cast<int>(inj.what)));
    std::mutex m;
    std::vector<std::string> errors(3);
    CHECK_THROWS(ddp::inproc::launch(3, [&](ddp::inproc::communicator& inner) {
      dc::checked_communicator comm(inner);
      try {
        issue_steps(comm, inj.what);
      } catch (const ddp::error& e) {
        std::lock_guard lock(m);
        errors[static_cast<std::size_t>(inner.rank())] = e.what();
        throw;
      }
    }, recorded(checked_dir)));
    for (const auto& e : errors) {
      CAPTURE(e);
      CHECK(contains(e, "ranks disagree on collective #2"));
      CHECK(contains(e, "ranks 0, 1 issued"));
      CHECK(contains(e, "step 1, bucket 1, gradients)"));
      CHECK(contains(e, "rank 2 issued " + std::string(inj.odd_issue)));
      CHECK(contains(e, "differs from the others: rank 2)"));
    }
    const auto c = ddp::why::judge_folder(checked_dir, "inproc");
    INFO(c.text);
    CHECK(c.sequence == v.sequence);
    CHECK(c.kind == v.kind);
    CHECK(c.odd == v.odd);
    REQUIRE(c.sides.size() == 2);
    CHECK(c.sides[1].call->describe() == v.sides[1].call->describe().replace(v.sides[1].call->describe().rfind("started"), 7, "issued"));
    fs::remove_all(dir);
    fs::remove_all(checked_dir);
  }
}

TEST_CASE("flight recorder: a rank asleep inside a step is named by the others' dumps and by its own SIGUSR1 dump") {
  const auto dir = fresh_dir("asleep");
  auto opts = recorded(dir);
  opts.timeout = 300ms;
  opts.recorder->dump_on_signal = true;
  const auto others_dumped = [&] {
    return fs::exists(dir / "inproc.rank0.jsonl") && fs::exists(dir / "inproc.rank1.jsonl");
  };
  std::atomic<bool> signalled{false};
  CHECK_THROWS(ddp::inproc::launch(3, [&](ddp::inproc::communicator& comm) {
    if (comm.rank() != 2) return issue_steps(comm, injected::none);
    std::vector<float> a(16, 1.0f);
    issue_first_step(comm, a);
    // Asleep in step 1 (bounded here, so the case ends): the others time out in #2 and dump.
    for (int i = 0; i < 500 && !others_dumped(); ++i) std::this_thread::sleep_for(10ms);
    ::kill(::getpid(), SIGUSR1);  // a user pokes the job: every recorder of the process dumps
    signalled = true;
    for (int i = 0; i < 500 && !fs::exists(dir / "inproc.rank2.jsonl"); ++i) std::this_thread::sleep_for(10ms);
    throw std::runtime_error("rank 2 woke up");
  }, opts));
  CHECK(signalled);
  REQUIRE(fs::exists(dir / "inproc.rank2.jsonl"));
  const auto mine = ddp::why::read_dump(dir / "inproc.rank2.jsonl");
  CHECK(mine.reason == "SIGUSR1");
  const auto v = ddp::why::judge_folder(dir, "inproc");
  INFO(v.text);
  CHECK(v.status == ddp::why::differ);
  REQUIRE(v.sequence.has_value());
  CHECK(*v.sequence == 2);
  CHECK(v.kind == "not_issued");
  CHECK(v.odd == std::vector<int>{2});
  REQUIRE(v.sides.size() == 2);
  CHECK(v.sides[0].ranks == std::vector<int>{0, 1});
  CHECK(v.sides[0].call->tag() == "step 1, bucket 1, gradients");
  CHECK(v.sides[0].call->state == "started");
  CHECK(!v.sides[1].call.has_value());
  CHECK(v.last_completed.at(2)->seq == 1);
  fs::remove_all(dir);
}

TEST_CASE("ddp-why: a missing dump is named with its last collective as the others saw it, and a cut dump is unreadable") {
  const auto dir = fresh_dir("missing");
  for (int r : {0, 2}) {
    dc::flight_recorder rec("mpi", r, 3, dc::recorder_options{.entries = 16, .dump_dir = dir.string(), .dump_on_signal = false});
    for (int i = 0; i < 3; ++i) {
      dc::step_scope step(i);
      const auto s = rec.issued("all_reduce", 8, ddp::dtype::f32, ddp::reduce_op::avg);
      rec.started(s);
      if (i < 2) rec.completed(s);  // #2 waits for rank 1, which was killed
    }
    CHECK(rec.dump("rank 1 is gone"));
  }
  auto v = ddp::why::judge_folder(dir, "mpi");
  INFO(v.text);
  CHECK(v.status == ddp::why::missing_dump);
  CHECK(v.missing == std::vector<int>{1});
  REQUIRE(v.missing_last_together.has_value());
  CHECK(v.missing_last_together->seq == 1);
  CHECK(v.missing_last_together->step == 1);
  REQUIRE(v.missing_waited_for.has_value());
  CHECK(v.missing_waited_for->seq == 2);
  CHECK(contains(v.text, "missing dump: rank 1"));

  {  // a file cut in the middle of an entry
    std::string text;
    {
      std::ifstream in(dir / "mpi.rank2.jsonl");
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    std::ofstream(dir / "mpi.rank2.jsonl") << text.substr(0, text.size() / 2);
  }
  v = ddp::why::judge_folder(dir, "mpi");
  CHECK(v.status == ddp::why::unreadable);
  REQUIRE(v.unreadable.size() == 1);
  CHECK(contains(v.unreadable[0], "mpi.rank2.jsonl"));
  fs::remove_all(dir);
}

TEST_CASE("checking mode: a rank that agrees on its policies where the others reduce gradients is said to have selected alone") {
  const auto dir = fresh_dir("policy_agreement");
  std::mutex m;
  std::vector<std::string> errors(3);
  CHECK_THROWS(ddp::inproc::launch(3, [&](ddp::inproc::communicator& inner) {
    dc::checked_communicator comm(inner);
    std::vector<float> a(16, 1.0f);
    issue_first_step(comm, a);
    dc::step_scope step(1);
    try {
      if (inner.rank() == 1) {  // as a trainer does at the first step after a one_of's select()
        dc::tag_scope agreeing(dc::purpose::policy_agreement);
        std::int64_t hash = 7, all[3] = {};
        comm.all_gather(ddp::const_buffer{&hash, 1, ddp::dtype::i64}, ddp::mutable_buffer{all, 3, ddp::dtype::i64}).wait();
      } else {
        dc::tag_scope bucket(dc::purpose::gradients, 1);
        comm.all_reduce(ddp::const_buffer{a.data(), 16, ddp::dtype::f32}, ddp::mutable_buffer{a.data(), 16, ddp::dtype::f32},
                        ddp::reduce_op::avg)
            .wait();
      }
    } catch (const ddp::error& e) {
      std::lock_guard lock(m);
      errors[static_cast<std::size_t>(inner.rank())] = e.what();
      throw;
    }
  }, recorded(dir)));
  const std::string hint = "rank 1 agrees on the trainer's policies, as a trainer does at the first step after a "
                           "one_of's select(), where the others do not";
  for (const auto& e : errors) {
    CAPTURE(e);
    CHECK(contains(e, "ranks disagree on collective #2"));
    CHECK(contains(e, "rank 1 issued all_gather #2 (count 1, i64; step 1, policy_agreement)"));
    CHECK(contains(e, hint));
  }
  // ddp-why says the same from the dumps.
  const auto v = ddp::why::judge_folder(dir, "inproc");
  INFO(v.text);
  CHECK(v.sequence == std::optional<std::uint64_t>(2));
  CHECK(v.odd == std::vector<int>{1});
  CHECK(contains(v.text, "\n  " + hint));
  fs::remove_all(dir);
}

}  // namespace flight_recorder_test
