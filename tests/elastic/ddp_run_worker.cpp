// A training program for ddp-run's tests (tests/elastic/ddp_run_test.sh): the elastic tests' toy
// problem under reduction::invariant<8> over MPI, with a rank that kills itself (SIGKILL) at a
// chosen step and micro-batch of the first membership. Its loop is any resumable loop's: it goes
// on from the trainer's epoch and step, and nothing in it knows about ddp-run.
//
//   ddp-run -n 3 -- ddp_run_worker --optimizer sgd|adamw --update replicated|sharded
//                  [--kill RANK@STEP.MICRO] [--checkpoint DIR] [--epochs E] [--step-ms T]
//                  [--throw-at STEP[:DELAY_MS]] [--hang RANK@STEP] [--timeout-ms T] --out DIR
//   ddp-run -n 3 -- ddp_run_worker --sync diloco [--no-sync-now] [--kill RANK@STEP] --out DIR
//
// It writes DIR/samples-<membership>-<rank>: a line "<step> <epoch> <sample>" for each sample of
// each step it begins, and, from rank 0 at the end, DIR/params: the parameters and buffers.
// --sync diloco: the same model and data under sync_schedule::diloco<4> with AdamW (a batch of 3
// a rank, without reduction::invariant), ending mid-period; at the end trainer.sync_now() (unless
// --no-sync-now) and synchronize_buffers(), and every rank writes DIR/params-<rank>.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ddp/data/loader.hpp"
#include "ddp/mpi/communicator.hpp"
#include "ddp/mpi/environment.hpp"
#include "trainer/indexed_rows.hpp"
#include "trainer/invariance.hpp"

namespace {

struct options {
  std::string optimizer = "sgd", update = "replicated", out, checkpoint;
  int kill_rank = -1;
  std::uint64_t kill_step = 0;
  std::size_t kill_micro = 0;
  std::uint64_t epochs = 2;
  int step_ms = 0;  // time each step's compute takes besides (a fault-injection loop needs steps that last)
  std::uint64_t throw_step = 0;  // every rank throws the same error in this step (0: none), rank r
  int throw_delay_ms = 0;        // r x this many ms after rank 0
  int hang_rank = -1;            // this rank sleeps for good in its first micro-batch of step hang_step
  std::uint64_t hang_step = 0;   // (of the first membership): it stops making progress without dying
  int timeout_ms = 0;            // the communicator's timeout (0: its default)
  std::string sync;              // "diloco": the sync schedule's run (train_diloco)
  bool sync_now = true;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(std::string(flag) + " needs a value");
      return argv[++i];
    };
    if (flag == "--optimizer") o.optimizer = value();
    else if (flag == "--update") o.update = value();
    else if (flag == "--out") o.out = value();
    else if (flag == "--checkpoint") o.checkpoint = value();
    else if (flag == "--epochs") o.epochs = std::stoull(value());
    else if (flag == "--step-ms") o.step_ms = std::stoi(value());
    else if (flag == "--sync") o.sync = value();
    else if (flag == "--no-sync-now") o.sync_now = false;
    else if (flag == "--timeout-ms") o.timeout_ms = std::stoi(value());
    else if (flag == "--hang") {  // RANK@STEP
      const std::string v = value();
      const auto at = v.find('@');
      o.hang_rank = std::stoi(v.substr(0, at));
      o.hang_step = std::stoull(v.substr(at + 1));
    } else if (flag == "--throw-at") {  // STEP[:DELAY_MS]
      const std::string v = value();
      const auto colon = v.find(':');
      o.throw_step = std::stoull(v.substr(0, colon));
      if (colon != std::string::npos) o.throw_delay_ms = std::stoi(v.substr(colon + 1));
    }
    else if (flag == "--kill") {  // RANK@STEP.MICRO
      const std::string v = value();
      const auto at = v.find('@'), dot = v.find('.');
      o.kill_rank = std::stoi(v.substr(0, at));
      o.kill_step = std::stoull(v.substr(at + 1, dot - at - 1));
      o.kill_micro = dot == std::string::npos ? 0 : std::stoul(v.substr(dot + 1));
    } else throw std::invalid_argument("unknown flag " + std::string(flag));
  }
  if (o.out.empty()) throw std::invalid_argument("--out DIR is required");
  return o;
}

// The samples each step took, one file per membership and rank, appended to.
std::FILE* open_samples_log(const std::string& out, int membership, int rank) {
  std::filesystem::create_directories(out);
  const auto path = std::filesystem::path(out) / ("samples-" + std::to_string(membership) + "-" + std::to_string(rank));
  std::FILE* log = std::fopen(path.c_str(), "a");
  if (!log) throw std::runtime_error("cannot write " + path.string());
  return log;
}

template <class Update, class Optimizer>
void train(ddp::mpi::communicator& comm, const options& o, Optimizer opt) {
  const int membership = ddp::run::agent::current() ? ddp::run::agent::current()->membership() : 0;
  auto model = invariance::make_bn_mlp(7);
  ddp::host::device dev;
  ddp::trainer<invariance::bn_mlp, ddp::reduction::invariant<8>, Update, Optimizer, ddp::bucket_cap<512>,
               ddp::use_communicator<ddp::mpi::communicator>>
      trainer(model, comm, dev, opt, {.seed = 4});
  const test::indexed_rows data(96);
  ddp::data::loader loader(data, 3, &test::indexed_rows::collate);  // 8 shards of 3: 24 samples, 4 steps an epoch
  std::FILE* log = open_samples_log(o.out, membership, comm.rank());
  while (trainer.epochs_started() < o.epochs) {
    const std::uint64_t epoch = trainer.epochs_started();
    for (const auto& shards : trainer.epoch_shards(loader)) {
      // Before the step: a step that completes on any rank took every rank's shards, also those
      // of a rank killed in it.
      for (std::size_t k = 0; k < shards.size(); ++k)
        for (auto s : test::real_samples(shards[k]))
          std::fprintf(log, "%llu %llu %zu\n", static_cast<unsigned long long>(trainer.steps() + 1),
                       static_cast<unsigned long long>(epoch), s);
      std::fflush(log);
      std::size_t micro = 0;
      trainer.step(shards, [&](auto& replica, const auto& b) {
        if (membership == 0 && comm.rank() == o.kill_rank && trainer.steps() == o.kill_step && micro == o.kill_micro)
          ::raise(SIGKILL);
        if (membership == 0 && comm.rank() == o.hang_rank && trainer.steps() + 1 == o.hang_step && micro == 0)
          for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
        if (trainer.steps() + 1 == o.throw_step && micro == 0) {  // the same error on every rank, a moment apart
          std::this_thread::sleep_for(std::chrono::milliseconds(o.throw_delay_ms * comm.rank()));
          throw std::runtime_error("injected error in step " + std::to_string(o.throw_step));
        }
        ++micro;
        if (o.step_ms) std::this_thread::sleep_for(std::chrono::milliseconds(o.step_ms));
        auto ce = ddp::nn::softmax_cross_entropy(replica.forward(b.x), b.y, b.weights);
        replica.backward(ce.grad);
      });
      if (!o.checkpoint.empty() && trainer.steps() % 2 == 0) trainer.save(o.checkpoint);
    }
  }
  std::fclose(log);
  if (comm.rank() == 0) {
    const auto params = invariance::parameters_of(trainer.module());
    std::FILE* f = std::fopen((std::filesystem::path(o.out) / "params").c_str(), "wb");
    std::fwrite(params.data(), sizeof(float), params.size(), f);
    std::fclose(f);
  }
}

void write_floats(const std::filesystem::path& path, const std::vector<float>& values) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + path.string());
  std::fwrite(values.data(), sizeof(float), values.size(), f);
  std::fclose(f);
}

// Under sync_schedule::diloco<4>: 2 epochs of 11 steps at 3 ranks (96 rows, 3 a rank), so the
// run ends 2 steps into a period; sync_now() then brings every rank to the same parameters.
void train_diloco(ddp::mpi::communicator& comm, const options& o) {
  const int membership = ddp::run::agent::current() ? ddp::run::agent::current()->membership() : 0;
  auto model = invariance::make_bn_mlp(7);
  ddp::host::device dev;
  ddp::trainer<invariance::bn_mlp, ddp::sync_schedule::diloco<4>, ddp::optim::adamw, ddp::bucket_cap<512>,
               ddp::use_communicator<ddp::mpi::communicator>>
      trainer(model, comm, dev, ddp::optim::adamw{.lr = 0.01f}, {.seed = 4});
  const test::indexed_rows data(96);
  ddp::data::loader loader(data, 3, &test::indexed_rows::collate);
  std::FILE* log = open_samples_log(o.out, membership, comm.rank());
  while (trainer.epochs_started() < o.epochs) {
    const std::uint64_t epoch = trainer.epochs_started();
    for (const auto& b : trainer.epoch(loader)) {
      for (auto s : test::real_samples(b))
        std::fprintf(log, "%llu %llu %zu\n", static_cast<unsigned long long>(trainer.steps() + 1),
                     static_cast<unsigned long long>(epoch), s);
      std::fflush(log);
      trainer.step([&](auto& replica) {
        if (membership == 0 && comm.rank() == o.kill_rank && trainer.steps() == o.kill_step) ::raise(SIGKILL);
        replica.backward(ddp::nn::softmax_cross_entropy(replica.forward(b.x), b.y, b.weights).grad);
      });
    }
  }
  std::fclose(log);
  if (o.sync_now) trainer.sync_now();
  trainer.synchronize_buffers();
  write_floats(std::filesystem::path(o.out) / ("params-" + std::to_string(comm.rank())),
               invariance::parameters_of(trainer.module()));
}

}  // namespace

// As any program's main: an exception that nothing catches ends the process where it was thrown,
// without unwinding, and no trainer could hand its state over.
int main(int argc, char** argv) try {
  ddp::mpi::environment env(&argc, &argv);
  const options o = parse(argc, argv);
  ddp::mpi::options comm_options;
  if (o.timeout_ms) comm_options.timeout = std::chrono::milliseconds(o.timeout_ms);
  ddp::mpi::communicator comm(MPI_COMM_WORLD, comm_options);
  if (o.sync == "diloco")
    train_diloco(comm, o);
  else if (!o.sync.empty())
    throw std::invalid_argument("--sync " + o.sync + ": this program has --sync diloco");
  else if (o.optimizer == "sgd" && o.update == "replicated")
    train<ddp::update::replicated>(comm, o, ddp::optim::sgd{.lr = 0.05f, .momentum = 0.9f});
  else if (o.optimizer == "adamw" && o.update == "replicated")
    train<ddp::update::replicated>(comm, o, ddp::optim::adamw{.lr = 0.01f});
  else if (o.optimizer == "adamw" && o.update == "sharded")
    train<ddp::update::sharded>(comm, o, ddp::optim::adamw{.lr = 0.01f});
  else
    throw std::invalid_argument("--optimizer " + o.optimizer + " --update " + o.update +
                                ": this program has sgd/replicated, adamw/replicated and adamw/sharded");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ddp_run_worker: %s\n", e.what());
  return 1;
}
