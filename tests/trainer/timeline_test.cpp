// The step timeline: what a recorded step writes as Chrome trace JSON (every rank a process with
// its tracks, every phase inside its step, events on one track nested), and that recording
// leaves the numerics alone.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/host/device.hpp"
#include "ddp/inproc/launch.hpp"
#include "trainer/test_model.hpp"

namespace trainer_timeline_test {

namespace {

constexpr int steps = 3;

template <class Update>
std::vector<std::vector<float>> train(int world, const std::string& trace_path) {
  return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(5);
    ddp::host::device dev;
    ddp::trainer<test::mlp, ddp::bucket_cap<256>, Update> trainer(model, comm, dev, {});
    ddp::timeline timeline;
    if (!trace_path.empty()) trainer.record_timeline(&timeline);
    for (int s = 0; s < steps; ++s) {
      const auto b = test::make_batch(8, 100 + static_cast<std::uint64_t>(s * world + comm.rank()));
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    }
    if (!trace_path.empty()) ddp::write_chrome_trace(comm, dev, timeline, trace_path);
    std::vector<float> values;
    for (auto& p : model.parameters())
      values.insert(values.end(), p.value.as<float>().begin(), p.value.as<float>().end());
    return values;
  });
}

struct span {
  std::string name;
  double begin, end;
  long long step;
};

std::string scratch_trace() {
  return (std::filesystem::temp_directory_path() / ("ddp_timeline_" + std::to_string(::getpid()) + ".json")).string();
}

// Events on one track either nest or follow each other, as a call stack's do.
void check_nested(const std::vector<span>& track, const std::string& where) {
  auto sorted = track;
  std::sort(sorted.begin(), sorted.end(),
            [](const span& a, const span& b) { return a.begin < b.begin || (a.begin == b.begin && a.end > b.end); });
  std::vector<span> open;
  for (const auto& e : sorted) {
    while (!open.empty() && open.back().end <= e.begin) open.pop_back();
    INFO(where, ": '", e.name, "' [", e.begin, ", ", e.end, "]");
    if (!open.empty()) {
      INFO("inside '", open.back().name, "' [", open.back().begin, ", ", open.back().end, "]");
      CHECK(e.end <= open.back().end);
    }
    open.push_back(e);
  }
}

template <class Update>
void check_trace(int world) {
  const auto path = scratch_trace();
  train<Update>(world, path);
  std::ifstream in(path);
  REQUIRE(in);
  const auto trace = nlohmann::json::parse(in);
  std::filesystem::remove(path);

  std::map<int, std::string> processes;
  std::map<std::pair<int, int>, std::string> threads;
  std::map<std::pair<int, int>, std::vector<span>> tracks;
  for (const auto& e : trace.at("traceEvents")) {
    const int pid = e.at("pid"), tid = e.at("tid");
    if (e.at("ph") == "M") {
      if (e.at("name") == "process_name") processes[pid] = e.at("args").at("name");
      if (e.at("name") == "thread_name") threads[{pid, tid}] = e.at("args").at("name");
      continue;
    }
    REQUIRE(e.at("ph") == "X");
    const double ts = e.at("ts"), dur = e.at("dur");
    CHECK(dur >= 0.0);
    tracks[{pid, tid}].push_back({e.at("name"), ts, ts + dur, e.at("args").at("step")});
  }
  REQUIRE(processes.size() == static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(processes[r] == "rank " + std::to_string(r));
    CHECK(threads[{r, 0}] == "step");
    CHECK(threads[{r, 1}] == "collectives");
    const auto& main = tracks[{r, 0}];
    const auto& collectives = tracks[{r, 1}];
    std::map<std::string, int> count;
    for (const auto& e : main) ++count[e.name];
    CHECK(count["step"] == steps);
    CHECK(count["forward"] == steps);
    CHECK(count["backward"] == steps);
    CHECK(count["update"] == steps);
    CHECK(count["wait for reductions"] == steps);
    CHECK(count["gather parameters"] == (ddp::update::gathers_parameters<Update>() ? steps : 0));
    CHECK(count["bucket 0 pack, launch"] == steps);
    int launches = 0;
    for (const auto& [name, n] : count)
      if (name.starts_with("bucket ")) launches += n;
    CHECK(launches > steps);  // bucket_cap<256> cuts the model into several buckets
    CHECK(collectives.size() == static_cast<std::size_t>(launches));
    for (const auto& c : collectives)
      CHECK(c.name.find(std::string(Update::name) + " reduction") != std::string::npos);
    check_nested(main, "rank " + std::to_string(r) + " step track");
    // Every phase, and every reduction, inside the step it belongs to.
    std::map<long long, span> step_of;
    for (const auto& e : main)
      if (e.name == "step") step_of[e.step] = e;
    for (const auto* list : {&main, &collectives})
      for (const auto& e : *list) {
        INFO("'", e.name, "' of step ", e.step);
        REQUIRE(step_of.count(e.step) == 1);
        CHECK(e.begin >= step_of[e.step].begin);
        CHECK(e.end <= step_of[e.step].end);
      }
  }
}

}  // namespace

TEST_CASE("a recorded step writes a Chrome trace: a process per rank, a track per thread, phases nested in their step") {
  SUBCASE("replicated, 2 ranks") { check_trace<ddp::update::replicated>(2); }
  SUBCASE("sharded, 3 ranks") { check_trace<ddp::update::sharded>(3); }
  SUBCASE("one rank") { check_trace<ddp::update::replicated>(1); }
}

TEST_CASE("recording a timeline leaves every bit of the training alone") {
  const auto path = scratch_trace();
  CHECK(train<ddp::update::sharded>(3, "") == train<ddp::update::sharded>(3, path));
  std::filesystem::remove(path);
}

TEST_CASE("a timeline keeps at most its capacity and counts the rest") {
  ddp::timeline t(2);
  const auto now = ddp::timeline::clock::now();
  for (int i = 0; i < 5; ++i) t.record("e", ddp::timeline_track::step, 0, now, now);
  CHECK(t.events().size() == 2);
  CHECK(t.dropped() == 3);
  t.clear();
  CHECK(t.events().empty());
  CHECK(t.dropped() == 0);
}

TEST_CASE("a trace that cannot be written names the path") {
  ddp::inproc::launch(1, [&](ddp::inproc::communicator& comm) {
    ddp::host::device dev;
    ddp::timeline t;
    CHECK_THROWS_WITH(ddp::write_chrome_trace(comm, dev, t, "/nonexistent-dir/trace.json"),
                      doctest::Contains("'/nonexistent-dir/trace.json'"));
  });
}

}  // namespace trainer_timeline_test
