// A rank that fails at any point of a step frees nothing a peer still touches, and every rank
// names the failing rank and its error. Failures are injected before the step, in forward, in
// backward before and after each ready report (so before and after each bucket is sent), in
// the optimizer update and in buffer synchronisation (before and after its collective), for
// both update policies and two world sizes, each repeated: run under the asan and tsan presets,
// and in a loop (DDP_FAILURE_REPEATS=200), as docs/testing.md describes.
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <string>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/inproc/launch.hpp"
#include "trainer/test_model.hpp"
#include "why/verdict.hpp"

namespace trainer_failure_test {

namespace {

enum class where { step_start, forward, backward, update, buffer_sync };

const char* name_of(where w) {
  switch (w) {
    case where::step_start: return "step_start";
    case where::forward: return "forward";
    case where::backward: return "backward";
    case where::update: return "update";
    case where::buffer_sync: return "buffer_sync";
  }
  return "?";
}

// Where one rank fails: in step `step`, at `at`, after `count` earlier events of that kind in the
// step (ready reports in backward, optimizer calls in the update, buffer copies in the sync).
struct fault {
  int rank = 0;
  where at = where::forward;
  int count = 0;
  int step = 1;

  std::string message() const {
    return "injected at " + std::string(name_of(at)) + " #" + std::to_string(count) + " on rank " +
           std::to_string(rank);
  }
};

// What the module, the device and the step function share on one rank.
struct injector {
  const fault* plan = nullptr;
  int rank = -1;
  int step = 0;
  int events = 0;  // of plan->at, in the current step

  void next_step() {
    ++step;
    events = 0;
  }
  // Throws when this is the planned event; counts it otherwise.
  void event(where w) {
    if (rank != plan->rank || step != plan->step || w != plan->at) return;
    if (events++ == plan->count) throw std::runtime_error(plan->message());
  }
};

// Wide enough that a bucket's reduction takes a while, with buffers for the sync to move.
using wide_mlp = ddp::nn::sequential<ddp::nn::linear, test::tracked_affine, ddp::nn::relu, ddp::nn::linear,
                                     ddp::nn::relu, ddp::nn::linear>;
constexpr std::size_t wide_parameters = 8;

class faulty_model {
 public:
  using input_type = ddp::nn::matrix;
  using output_type = ddp::nn::matrix;
  static constexpr bool reports_gradient_ready = true;

  faulty_model(injector& inj, std::uint64_t seed)
      : inj_(inj),
        m_(ddp::nn::linear(test::in_features, 128, seed), test::tracked_affine(128), ddp::nn::relu(),
           ddp::nn::linear(128, 128, seed + 1), ddp::nn::relu(), ddp::nn::linear(128, test::classes, seed + 2)) {}

  std::vector<ddp::parameter_ref> parameters() { return m_.parameters(); }
  std::vector<ddp::buffer_ref> buffers() { return m_.buffers(); }
  ddp::nn::matrix forward(const ddp::nn::matrix& x) {
    inj_.event(where::forward);
    return m_.forward(x);
  }
  // Events 0..7 fail after that many ready reports: before the first bucket goes, between
  // buckets, and after the last one went.
  void backward(const ddp::nn::matrix& g, const ddp::ready_sink& ready) {
    inj_.event(where::backward);
    auto counted = [&](std::size_t i) {
      ready(i);
      inj_.event(where::backward);
    };
    m_.backward(g, ddp::ready_sink(counted));
  }
  void bind_gradient(std::size_t i, float* storage) { m_.bind_gradient(i, storage); }
  void bind_parameter(std::size_t i, float* storage) { m_.bind_parameter(i, storage); }

 private:
  injector& inj_;
  wide_mlp m_;
};

// The host device, failing where the plan says: in the optimizer and in the buffer groups'
// copies (two before the sync's collective, two after).
struct faulty_device : ddp::host::device {
  injector* inj = nullptr;
  void copy(void* dst, const void* src, std::size_t bytes) {
    inj->event(where::buffer_sync);
    ddp::host::device::copy(dst, src, bytes);
  }
  template <int S, class Rule>
  void elementwise(std::span<const ddp::segment> p, const float* g, float* state, std::size_t stride, const Rule& r) {
    inj->event(where::update);
    ddp::host::device::elementwise<S>(p, g, state, stride, r);
  }
};

template <class Update>
using faulty_trainer = ddp::trainer<faulty_model, ddp::use_device<faulty_device>, ddp::bucket_cap<16384>,
                                    ddp::buffer_sync::broadcast_once_per_step, Update>;

// Runs three steps on `world` ranks with `plan`; returns what each rank threw.
template <class Update>
std::vector<std::string> run_with(int world, const fault& plan) {
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  try {
    ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
      try {
        injector inj{&plan, comm.rank()};
        faulty_model model(inj, 3);
        faulty_device dev;
        dev.inj = &inj;
        faulty_trainer<Update> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.05f, .momentum = 0.9f});
        const auto b = test::make_batch(12, 40 + static_cast<std::uint64_t>(comm.rank()));
        for (int s = 0; s < 3; ++s) {
          inj.next_step();
          trainer.step([&](auto& r) {
            inj.event(where::step_start);
            r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad);
          });
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(comm.rank())] = e.what();
        throw;
      }
    });
  } catch (const std::exception&) {
  }
  return errors;
}

int repeats() {
  const char* env = std::getenv("DDP_FAILURE_REPEATS");
  return env ? std::max(1, std::atoi(env)) : 4;
}

// Every injection point of a step, with the count of events before it.
std::vector<fault> every_fault(int rank, int buckets) {
  std::vector<fault> faults{{rank, where::step_start, 0}, {rank, where::forward, 0}};
  for (int k = 0; k <= static_cast<int>(wide_parameters); ++k) faults.push_back({rank, where::backward, k});
  for (int k = 0; k < buckets; ++k) faults.push_back({rank, where::update, k});
  for (int k : {0, 2}) faults.push_back({rank, where::buffer_sync, k});  // before, after the collective
  return faults;
}

template <class Update>
void check_every_fault() {
  for (int world : {2, 3}) {
    const int failing = world - 1;
    for (const auto& plan : every_fault(failing, 3)) {
      for (int rep = 0; rep < repeats(); ++rep) {
        const auto errors = run_with<Update>(world, plan);
        CAPTURE(world);
        CAPTURE(plan.message());
        CHECK(errors[static_cast<std::size_t>(failing)] == plan.message());
        for (int r = 0; r < failing; ++r) {
          CAPTURE(r);
          CHECK(errors[static_cast<std::size_t>(r)].find("rank " + std::to_string(failing) + " failed: " +
                                                          plan.message()) != std::string::npos);
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("a failure at any point of a step reaches every rank as the cause, and frees nothing in use") {
  // The layout the update faults count on: three buckets, each updated by one optimizer call.
  ddp::inproc::launch(1, [](ddp::inproc::communicator& comm) {
    const fault none{-1};
    injector inj{&none, 0};
    faulty_model model(inj, 3);
    faulty_device dev;
    dev.inj = &inj;
    faulty_trainer<ddp::update::replicated> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.05f});
    REQUIRE(trainer.bucket_count() == 3);
  });
  SUBCASE("update::replicated") { check_every_fault<ddp::update::replicated>(); }
  SUBCASE("update::sharded") { check_every_fault<ddp::update::sharded>(); }
}

TEST_CASE("a rank asleep in a step: the others' flight recorder dumps name it, with the trainer's tags") {
  // Ranks 0 and 1 time out in step 1's first collective and dump; rank 2 never issues it.
  namespace fs = std::filesystem;
  using namespace std::chrono_literals;
  const fs::path dir = fs::temp_directory_path() / ("ddp_flight_trainer_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ddp::inproc::options opts;
  opts.timeout = 300ms;
  opts.recorder = ddp::comm::recorder_options{.entries = 2000, .dump_dir = dir.string(), .dump_on_signal = false};
  CHECK_THROWS(ddp::inproc::launch(3, [&](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(5);
    ddp::host::device dev;
    ddp::trainer<test::mlp, ddp::bucket_cap<256>> trainer(model, comm, dev, {});
    for (int s = 0; s < 2; ++s) {
      const auto b = test::make_batch(8, 100 + static_cast<std::uint64_t>(s * 3 + comm.rank()));
      trainer.step([&](auto& r) {
        if (s == 1 && comm.rank() == 2) {  // asleep until the others timed out and dumped (bounded), then gone
          for (int i = 0; i < 500 && !fs::exists(dir / "inproc.rank1.jsonl"); ++i) std::this_thread::sleep_for(10ms);
          throw std::runtime_error("rank 2 never woke up");
        }
        r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad);
      });
    }
  }, opts));
  const auto v = ddp::why::judge_folder(dir, "inproc");
  INFO(v.text);
  REQUIRE(v.sequence.has_value());
  CHECK(v.odd == std::vector<int>{2});
  REQUIRE(v.sides.size() == 2);
  CHECK(v.sides[0].ranks == std::vector<int>{0, 1});
  REQUIRE(v.sides[0].call.has_value());
  CHECK(v.kind == "not_issued");
  CHECK(v.sides[0].call->step == 1);
  CHECK(v.sides[0].call->purpose == "buffer_sync");  // step 1 begins with the buffers' broadcast
  CHECK(!v.sides[1].call.has_value());
  // Rank 0's record: the parameters' broadcast at construction, then step 0's buckets.
  const auto mine = ddp::why::read_dump(dir / "inproc.rank0.jsonl");
  bool step0_gradients = false;
  for (const auto& e : mine.entries) step0_gradients |= e.step == 0 && e.purpose == "gradients" && e.bucket >= 0;
  CHECK(step0_gradients);
  fs::remove_all(dir);
}

}  // namespace trainer_failure_test
