// Checkpoints: N steps, save, a new trainer over a freshly built module loads, M more steps —
// bitwise the run of N + M steps that never stopped (SGD with momentum and AdamW, replicated
// and sharded, worlds 1-4, saved in the middle of an epoch); at another world size, within the
// equivalence bound; and every file that cannot be loaded is an error naming what differs.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>
#include <type_traits>

#include "ddp/data/loader.hpp"
#include "ddp/ddp.hpp"
#include "ddp/host/device.hpp"
#include "ddp/inproc/launch.hpp"
#include "trainer/test_model.hpp"

namespace trainer_checkpoint_test {

namespace fs = std::filesystem;

namespace {

// The toy problem, one sample per row (seed 23).
struct rows : test::toy_dataset {
  explicit rows(std::size_t n) : test::toy_dataset(n, 23) {}
};

fs::path scratch(const std::string& name) {
  // The process id too: ctest runs the cases of this file in parallel processes.
  auto dir = fs::temp_directory_path() / ("ddp_checkpoint_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

using padded = ddp::sampler::distributed<true, ddp::sampler::tail::pad>;

// Runs `steps` steps through trainer.epoch(loader) epochs (5 batches each: 40 rows, world x
// batch = 8), saving after `save_after` steps when given; a run that starts with `resume` loads
// it first. Returns the parameters and the buffers' first values.
template <class Optimizer, class Update>
std::vector<std::vector<float>> run(ddp::inproc::communicator& comm, const rows& data, std::size_t batch,
                                    std::size_t steps, std::optional<std::size_t> save_after, const fs::path& dir,
                                    bool resume, Optimizer opt, std::uint64_t init_seed = 5) {
  test::mlp model = test::make_mlp(init_seed);
  ddp::host::device dev;
  ddp::trainer<test::mlp, padded, Optimizer, Update, ddp::bucket_cap<256>> trainer(model, comm, dev, opt, {.seed = 9});
  if (resume) trainer.load(dir);
  const ddp::data::loader loader(data, batch, &rows::collate);
  while (trainer.steps() < steps) {
    for (const auto& b : trainer.epoch(loader)) {
      trainer.step([&](auto& r) {
        r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y, b.weights).grad);
      });
      if (save_after && trainer.steps() == *save_after) trainer.save(dir);
      if (trainer.steps() == steps) break;
    }
  }
  auto out = test::parameter_values(model);
  for (const auto& buf : model.buffers()) {
    std::vector<float> v(buf.value.numel());
    if (buf.value.type == ddp::dtype::f32) std::copy_n(static_cast<const float*>(buf.value.data), v.size(), v.begin());
    else v.assign(1, static_cast<float>(*static_cast<const std::int64_t*>(buf.value.data)));
    out.push_back(std::move(v));
  }
  return out;
}

template <class Optimizer, class Update>
void check_exact_resume(Optimizer opt) {
  const rows data(40);
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    const std::size_t batch = world == 3 ? 3 : 8 / static_cast<std::size_t>(world);
    const auto dir = scratch("exact");
    // 7 uninterrupted steps, against 3 steps, a save, and 4 more in a new trainer built from
    // another seed (the checkpoint must overwrite every value). 3 steps is mid-epoch.
    const auto whole = ddp::inproc::launch(world, [&](ddp::inproc::communicator& c) {
      return run<Optimizer, Update>(c, data, batch, 7, std::nullopt, dir, false, opt);
    });
    ddp::inproc::launch(world, [&](ddp::inproc::communicator& c) {
      return run<Optimizer, Update>(c, data, batch, 3, 3, dir, false, opt);
    });
    CHECK(ddp::has_checkpoint(dir));
    const auto resumed = ddp::inproc::launch(world, [&](ddp::inproc::communicator& c) {
      return run<Optimizer, Update>(c, data, batch, 7, std::nullopt, dir, true, opt, /*init_seed=*/77);
    });
    for (int r = 0; r < world; ++r) CHECK(resumed[static_cast<std::size_t>(r)] == whole[static_cast<std::size_t>(r)]);
    fs::remove_all(dir);
  }
}

}  // namespace

TEST_CASE("save, load in a new trainer, continue: bitwise the run that never stopped (SGD momentum)") {
  const ddp::optim::sgd sgd{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-3f, .nesterov = false};
  check_exact_resume<ddp::optim::sgd, ddp::update::replicated>(sgd);
  check_exact_resume<ddp::optim::sgd, ddp::update::sharded>(sgd);
}

TEST_CASE("save, load in a new trainer, continue: bitwise the run that never stopped (AdamW)") {
  const ddp::optim::adamw adamw{.lr = 1e-2f, .weight_decay = 1e-2f};
  check_exact_resume<ddp::optim::adamw, ddp::update::replicated>(adamw);
  check_exact_resume<ddp::optim::adamw, ddp::update::sharded>(adamw);
}

TEST_CASE("a checkpoint from world 2 goes on at worlds 4 and 1 with the same global batch") {
  const rows data(40);
  const ddp::optim::adamw adamw{.lr = 1e-2f, .weight_decay = 1e-2f};
  const auto dir = scratch("reshard");
  // 5 steps = one epoch at global batch 8, saved at its end; then 5 more.
  const auto whole = ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) {
    return run<ddp::optim::adamw, ddp::update::sharded>(c, data, 4, 10, 5, dir, false, adamw);
  })[0];
  for (int world : {4, 1}) {
    CAPTURE(world);
    const auto resumed = ddp::inproc::launch(world, [&](ddp::inproc::communicator& c) {
      return run<ddp::optim::adamw, ddp::update::sharded>(c, data, 8 / static_cast<std::size_t>(world), 10,
                                                          std::nullopt, dir, true, adamw, 77);
    })[0];
    // The parameters (the buffers hold rank 0's running statistics, of another part of the batch).
    test::mlp shape = test::make_mlp(1);
    const std::size_t params = test::parameter_values(shape).size();
    REQUIRE(resumed.size() == whole.size());
    const std::vector<std::vector<float>> a(resumed.begin(), resumed.begin() + static_cast<std::ptrdiff_t>(params)),
        b(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(params));
    CHECK(test::max_relative_error(a, b) < 1e-5);
    CHECK(a != b);  // not the same bits: another world sums in another order
  }
  fs::remove_all(dir);
}

namespace {
// Every rank's error when a trainer of type Trainer over make_model() loads `dir` ("" if none).
template <class Trainer, class MakeModel>
std::vector<std::string> load_errors(int world, const fs::path& dir, MakeModel make_model,
                                     typename Trainer::optimizer_type opt = {}) {
  return ddp::inproc::launch(world, [&](ddp::inproc::communicator& c) -> std::string {
    auto model = make_model();
    ddp::host::device dev;
    Trainer t(model, c, dev, opt);
    try {
      t.load(dir);
    } catch (const ddp::error& e) {
      return e.what();
    }
    return "";
  });
}
void check_every_rank(const std::vector<std::string>& errors, const std::string& text) {
  for (const auto& e : errors) {
    CAPTURE(e);
    CHECK(e.find(text) != std::string::npos);
  }
}
// The same, on the error's first line: what is wrong, and what to do.
void check_first_line(const std::vector<std::string>& errors, const std::string& text) {
  for (const auto& e : errors) {
    CAPTURE(e);
    CHECK(e.substr(0, e.find('\n')).find(text) != std::string::npos);
  }
}
using sgd_trainer = ddp::trainer<test::mlp, padded, ddp::bucket_cap<256>>;
}  // namespace

namespace {
// docs/checkpoints.md's resume loop, 2 epochs of 5 steps at world 2; it stops (as if killed) right
// after saving at step `stop_at`. Returns the parameters, the step count and, after a load, the
// epochs_started() it began from.
struct loop_result {
  std::vector<std::vector<float>> parameters;
  std::uint64_t steps = 0, first_epoch = 0;
};
loop_result resume_loop(ddp::inproc::communicator& comm, const fs::path& dir, std::optional<std::uint64_t> stop_at,
                        std::uint64_t init_seed = 5) {
  const rows data(40);
  test::mlp model = test::make_mlp(init_seed);  // a resumed run's are overwritten by the load
  ddp::host::device dev;
  ddp::trainer<test::mlp, padded, ddp::bucket_cap<256>> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.1f, .momentum = 0.9f},
                                                                 {.seed = 9});
  const ddp::data::loader loader(data, 4, &rows::collate);
  const std::uint64_t epochs = 2;
  if (ddp::has_checkpoint(dir)) trainer.load(dir);
  loop_result out;
  out.first_epoch = trainer.epochs_started();
  for (auto epoch = trainer.epochs_started(); epoch < epochs; ++epoch) {
    for (const auto& b : trainer.epoch(loader)) {
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y, b.weights).grad); });
      if (stop_at && trainer.steps() == *stop_at) {
        trainer.save(dir);
        out.steps = trainer.steps();
        return out;
      }
    }
  }
  out.parameters = test::parameter_values(model);
  out.steps = trainer.steps();
  return out;
}
}  // namespace

TEST_CASE("docs/checkpoints.md's resume loop: after a mid-epoch load epochs_started() leaves out the half-finished "
          "epoch, and the loop ends where the run that never stopped does") {
  const auto dir = scratch("resume_loop");
  const auto whole = ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) { return resume_loop(c, dir, std::nullopt); });
  REQUIRE(whole[0].steps == 10);
  for (const std::uint64_t stop_at : {3u, 5u, 7u}) {  // mid epoch 1, its end, mid epoch 2
    CAPTURE(stop_at);
    fs::remove_all(dir);
    ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) { return resume_loop(c, dir, stop_at); });
    const auto resumed =
        ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) { return resume_loop(c, dir, std::nullopt, 77); });
    for (std::size_t r = 0; r < 2; ++r) {
      CHECK(resumed[r].first_epoch == (stop_at < 5 ? 0u : 1u));  // the epochs finished before the save
      CHECK(resumed[r].steps == 10);
      CHECK(resumed[r].parameters == whole[r].parameters);
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("a checkpoint that cannot be loaded is an error on every rank naming what differs") {
  const rows data(40);
  const ddp::optim::sgd sgd{.lr = 0.1f, .momentum = 0.9f};
  const auto dir = scratch("errors");
  ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) {  // saved after 3 steps: mid-epoch
    return run<ddp::optim::sgd, ddp::update::replicated>(c, data, 4, 3, 3, dir, false, sgd);
  });
  const auto mlp = [] { return test::make_mlp(1); };
  CHECK(load_errors<sgd_trainer>(2, dir, mlp, sgd) == std::vector<std::string>{"", ""});

  // Another model, other policies.
  using small = ddp::nn::sequential<ddp::nn::linear, ddp::nn::relu, ddp::nn::linear>;
  check_every_rank(load_errors<ddp::trainer<small, padded, ddp::bucket_cap<256>>>(
                       2, dir, [] { return small(ddp::nn::linear(test::in_features, 16, 1), ddp::nn::relu(),
                                                 ddp::nn::linear(16, test::classes, 2)); }),
                   "holds another model: its entry 2 is ");
  check_every_rank(load_errors<ddp::trainer<test::mlp, padded, ddp::bucket_cap<256>, ddp::optim::adamw>>(2, dir, mlp),
                   "was written by a trainer with other policies: the checkpoint has optimizer=sgd, this trainer "
                   "optimizer=adamw");
  check_every_rank(load_errors<ddp::trainer<test::mlp, padded, ddp::bucket_cap<1024>>>(2, dir, mlp, sgd),
                   "the checkpoint has bucket_cap=256 bytes, this trainer bucket_cap=1 KiB");
  // A policy's name may hold ", ", and the plain reduction goes unnamed: the slots still pair up.
  using dropping = ddp::sampler::distributed<true, ddp::sampler::tail::drop>;
  check_every_rank(load_errors<ddp::trainer<test::mlp, dropping, ddp::bucket_cap<256>>>(2, dir, mlp, sgd),
                   "the checkpoint has sampler=distributed(shuffle, pad), this trainer sampler=distributed(shuffle, "
                   "drop); build the trainer");
  check_every_rank(
      load_errors<ddp::trainer<test::mlp, padded, ddp::bucket_cap<256>, ddp::reduction::invariant<2>>>(2, dir, mlp, sgd),
      "the checkpoint has the default reduction, this trainer reduction=invariant(2); build the trainer");

  // A save that died half-way (a temporary file, a step directory without LATEST's blessing)
  // leaves the committed checkpoint loadable.
  const auto committed = ddp::detail::checkpoint_directory{dir}.committed();
  REQUIRE(committed);
  fs::create_directories(dir / "step-000000000099");
  std::ofstream(dir / "step-000000000099" / "rank-0-of-2.ddpckpt.tmp.1.0") << "half";
  CHECK(load_errors<sgd_trainer>(2, dir, mlp, sgd) == std::vector<std::string>{"", ""});

  // Damaged files.
  const auto file = dir / committed->first / "rank-1-of-2.ddpckpt";
  auto bytes = ddp::detail::read_whole_file(file);
  auto write = [&](const std::vector<std::uint8_t>& b) {
    std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  };
  auto flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x10;
  write(flipped);
  check_every_rank(load_errors<sgd_trainer>(2, dir, mlp, sgd), "rank-1-of-2.ddpckpt' is corrupt: its checksum");
  write({bytes.begin(), bytes.end() - 100});
  check_every_rank(load_errors<sgd_trainer>(2, dir, mlp, sgd), "rank-1-of-2.ddpckpt' is truncated");
  // The default save_options keep one checkpoint: the first line says none is left to fall back to.
  check_first_line(load_errors<sgd_trainer>(2, dir, mlp, sgd),
                   "rank 1: '" + (dir / committed->first / "rank-1-of-2.ddpckpt").string() +
                       "' is truncated or has trailing bytes: its header says " + std::to_string(bytes.size()) +
                       " bytes, the file has " + std::to_string(bytes.size() - 100) +
                       "; the checkpoint cannot be used: no earlier checkpoint is left in '" + dir.string() +
                       "' (its save_options kept only step-000000000003): restore the file, or start over");
  write(bytes);
  CHECK(load_errors<sgd_trainer>(2, dir, mlp, sgd) == std::vector<std::string>{"", ""});
  fs::remove(dir / "LATEST");
  check_every_rank(load_errors<sgd_trainer>(2, dir, mlp, sgd), "no checkpoint in '" + dir.string() + "'");
  CHECK_FALSE(ddp::has_checkpoint(dir));
  fs::remove_all(dir);
}

TEST_CASE("a checkpoint whose sections claim more bytes than the file has is refused before allocating") {
  // A well-formed frame (right length, right checksum) around a section that claims 2^60 bytes.
  std::vector<std::uint8_t> body;
  auto put = [&](const void* p, std::size_t n) {
    body.insert(body.end(), static_cast<const std::uint8_t*>(p), static_cast<const std::uint8_t*>(p) + n);
  };
  const std::uint32_t name_size = 1;
  const std::uint64_t size = std::uint64_t{1} << 60;
  put(&name_size, 4);
  put("a", 1);
  put(&size, 8);
  std::vector<std::uint8_t> file{'D', 'D', 'P', 'C', 'K', 'P', 'T', '1'};
  const std::uint64_t length = body.size();
  file.insert(file.end(), reinterpret_cast<const std::uint8_t*>(&length), reinterpret_cast<const std::uint8_t*>(&length) + 8);
  file.insert(file.end(), body.begin(), body.end());
  const std::uint32_t crc = ddp::detail::crc32(body);
  file.insert(file.end(), reinterpret_cast<const std::uint8_t*>(&crc), reinterpret_cast<const std::uint8_t*>(&crc) + 4);
  CHECK_THROWS_WITH_AS(ddp::detail::checkpoint_file::decode(file, "crafted"),
                       doctest::Contains("'crafted' is corrupt: a section runs past the end"), ddp::error);
  // A length field near 2^64 must not wrap around the size check.
  auto wrapped = file;
  const std::uint64_t huge = ~std::uint64_t{0} - 10;
  std::memcpy(wrapped.data() + 8, &huge, 8);
  CHECK_THROWS_WITH_AS(ddp::detail::checkpoint_file::decode(wrapped, "crafted"), doctest::Contains("is truncated"),
                       ddp::error);
}

namespace {
// Steps once per entry of `metrics` (epochs of 5 steps at world 2), saving after each step with
// `options` and that step's metric (NaN: none). Returns this rank's parameters after each step.
std::vector<std::vector<std::vector<float>>> save_each_step(ddp::inproc::communicator& comm, const fs::path& dir,
                                                            const std::vector<double>& metrics,
                                                            ddp::save_options options) {
  const rows data(40);
  test::mlp model = test::make_mlp(5);
  ddp::host::device dev;
  sgd_trainer trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.1f, .momentum = 0.9f}, {.seed = 9});
  const ddp::data::loader loader(data, 4, &rows::collate);
  std::vector<std::vector<std::vector<float>>> after;
  while (after.size() < metrics.size()) {
    for (const auto& b : trainer.epoch(loader)) {
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y, b.weights).grad); });
      const double m = metrics[after.size()];
      options.metric = std::isnan(m) ? std::nullopt : std::optional<double>(m);
      trainer.save(dir, options);
      after.push_back(test::parameter_values(model));
      if (after.size() == metrics.size()) break;
    }
  }
  return after;
}

// Every rank's parameters after a trainer over a module of another seed loads `dir` (at `steps`).
std::vector<std::vector<std::vector<float>>> loaded(int world, const fs::path& dir, std::optional<std::uint64_t> steps) {
  return ddp::inproc::launch(world, [&](ddp::inproc::communicator& c) {
    test::mlp model = test::make_mlp(77);
    ddp::host::device dev;
    sgd_trainer trainer(model, c, dev, ddp::optim::sgd{.lr = 0.1f, .momentum = 0.9f});
    if (steps) trainer.load(dir, *steps);
    else trainer.load(dir);
    return test::parameter_values(model);
  });
}

std::vector<std::string> step_directories(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::uint64_t> committed_steps(const fs::path& dir) {
  std::vector<std::uint64_t> steps;
  for (const auto& c : ddp::committed_checkpoints(dir)) steps.push_back(c.steps);
  return steps;
}
}  // namespace

TEST_CASE("checkpoints kept by save_options: the last k, every n steps, the best k by a metric, and load(dir, steps) reads any") {
  const auto dir = scratch("retention");
  const double none = std::nan("");
  // Steps 1-8. Kept: the last 2 (7, 8), every 3 steps (3, 6), the 2 lowest metrics (4: 0.2, 2: 0.3).
  const std::vector<double> metrics{0.5, 0.3, 0.6, 0.2, 0.7, 0.4, none, 0.9};
  const ddp::save_options options{.keep_last = 2, .keep_every_steps = 3, .keep_best = 2};
  const auto after = ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) {
    return save_each_step(c, dir, metrics, options);
  });
  CHECK(committed_steps(dir) == std::vector<std::uint64_t>{2, 3, 4, 6, 7, 8});
  CHECK(step_directories(dir) == std::vector<std::string>{"step-000000000002", "step-000000000003", "step-000000000004",
                                                           "step-000000000006", "step-000000000007", "step-000000000008"});
  const auto listed = ddp::committed_checkpoints(dir);
  CHECK(listed[0] == ddp::checkpoint_info{2, 2, 0.3});
  CHECK(listed[4] == ddp::checkpoint_info{7, 2, std::nullopt});  // saved without a metric
  CHECK(listed[5] == ddp::checkpoint_info{8, 2, 0.9});

  // The latest by default; any kept one by its step count, bitwise the run at that step.
  CHECK(loaded(2, dir, std::nullopt) == std::vector{after[0][7], after[1][7]});
  CHECK(loaded(2, dir, 4) == std::vector{after[0][3], after[1][3]});
  CHECK(loaded(2, dir, 2) == std::vector{after[0][1], after[1][1]});
  check_every_rank(ddp::inproc::launch(2,
                                      [&](ddp::inproc::communicator& c) -> std::string {
                                        test::mlp model = test::make_mlp(77);
                                        ddp::host::device dev;
                                        sgd_trainer trainer(model, c, dev, ddp::optim::sgd{.lr = 0.1f});
                                        try {
                                          trainer.load(dir, 5);
                                        } catch (const ddp::error& e) {
                                          return e.what();
                                        }
                                        return "";
                                      }),
                   "no checkpoint of step 5 in '" + dir.string() + "': its committed checkpoints are of steps 2, 3, 4, 6, 7, 8");

  // The latest one damaged: the error's first line names it and the one committed before it.
  const auto damaged = dir / "step-000000000008" / "rank-0-of-2.ddpckpt";
  fs::resize_file(damaged, fs::file_size(damaged) - 1);
  check_first_line(ddp::inproc::launch(2,
                                       [&](ddp::inproc::communicator& c) -> std::string {
                                         test::mlp model = test::make_mlp(77);
                                         ddp::host::device dev;
                                         sgd_trainer trainer(model, c, dev, ddp::optim::sgd{.lr = 0.1f});
                                         try {
                                           trainer.load(dir);
                                         } catch (const ddp::error& e) {
                                           return e.what();
                                         }
                                         return "";
                                       }),
                   "rank 0: '" + damaged.string() + "' is truncated or has trailing bytes: its header says " +
                       std::to_string(fs::file_size(damaged) + 1) + " bytes, the file has " +
                       std::to_string(fs::file_size(damaged)) +
                       "; the checkpoint cannot be used: load the checkpoint committed before it, of step 7 "
                       "(trainer.load(dir, 7), '" + (dir / "step-000000000007").string() + "')");

  // A save with the defaults keeps only itself; a step directory no index lists (a save that died
  // before its commit) goes too.
  fs::create_directories(dir / "step-000000000099");
  ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) { (void)save_each_step(c, dir, {none}, {}); });
  CHECK(committed_steps(dir) == std::vector<std::uint64_t>{1});
  CHECK(step_directories(dir) == std::vector<std::string>{"step-000000000001"});
  fs::remove_all(dir);
}

TEST_CASE("which checkpoints a save keeps: order, ties, highest is best, a LATEST of one line") {
  using ddp::checkpoint_info;
  const std::vector<checkpoint_info> all{{10, 2, 0.8}, {20, 2, 0.9}, {30, 2, std::nullopt}, {40, 2, 0.9}, {50, 2, 0.1}};
  auto steps = [](const std::vector<checkpoint_info>& kept) {
    std::vector<std::uint64_t> s;
    for (const auto& c : kept) s.push_back(c.steps);
    return s;
  };
  CHECK(steps(ddp::detail::retained(all, {})) == std::vector<std::uint64_t>{50});
  CHECK(steps(ddp::detail::retained(all, {.keep_last = 9})) == std::vector<std::uint64_t>{10, 20, 30, 40, 50});
  // Highest first; of two equal metrics the earlier save ranks first.
  CHECK(steps(ddp::detail::retained(all, {.keep_best = 1, .lower_is_better = false})) == std::vector<std::uint64_t>{20, 50});
  CHECK(steps(ddp::detail::retained(all, {.keep_best = 2})) == std::vector<std::uint64_t>{10, 50});
  CHECK(steps(ddp::detail::retained(all, {.keep_every_steps = 20})) == std::vector<std::uint64_t>{20, 40, 50});

  // LATEST written by a save before the index (its first line alone) lists that one checkpoint.
  const auto dir = scratch("one_line");
  fs::create_directories(dir);
  std::ofstream(dir / "LATEST") << "step-000000000003 2\n";
  CHECK(ddp::committed_checkpoints(dir) == std::vector<checkpoint_info>{{3, 2, std::nullopt}});
  const auto text = ddp::detail::checkpoint_directory::index_text(all);
  std::ofstream(dir / "LATEST") << text;
  CHECK(ddp::committed_checkpoints(dir) == all);
  std::ofstream(dir / "LATEST") << "step-000000000003 2\ncheckpoint step-000000000003 2 zero\n";
  CHECK_THROWS_WITH_AS(ddp::committed_checkpoints(dir), doctest::Contains("the line 'checkpoint step-000000000003 2 zero' is not"),
                       ddp::error);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint save options that differ across ranks or make no sense: an error on every rank, nothing written") {
  const auto dir = scratch("options");
  ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) { (void)save_each_step(c, dir, {0.5}, {}); });
  REQUIRE(committed_steps(dir) == std::vector<std::uint64_t>{1});
  const auto latest = ddp::detail::read_whole_file(dir / "LATEST");
  const auto rank_file = ddp::detail::read_whole_file(dir / "step-000000000001" / "rank-0-of-2.ddpckpt");
  auto errors = [&](auto options_of_rank) {
    return ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) -> std::string {
      try {
        (void)save_each_step(c, dir, {0.25}, options_of_rank(c.rank()));
      } catch (const ddp::error& e) {
        return e.what();
      }
      return "";
    });
  };
  // save_each_step sets each rank's metric alike; here rank 1 keeps more.
  check_every_rank(errors([](int rank) { return ddp::save_options{.keep_last = rank == 0 ? 1u : 2u}; }),
                   "rank 1: its save options (keep_last=2, keep_every_steps=0, metric=0.25, keep_best=0, "
                   "lower_is_better=true) differ from rank 0's (keep_last=1, ");
  check_every_rank(errors([](int) { return ddp::save_options{.keep_last = 0}; }), "save_options::keep_last is 0");
  CHECK(ddp::detail::read_whole_file(dir / "LATEST") == latest);
  CHECK(ddp::detail::read_whole_file(dir / "step-000000000001" / "rank-0-of-2.ddpckpt") == rank_file);
  CHECK(step_directories(dir) == std::vector<std::string>{"step-000000000001"});
  CHECK(ddp::detail::save_options_problem({.metric = std::nan("")}).find("metric is NaN") != std::string::npos);
  // Compared before anything is written: no rank leaves a file of the refused save.
  const auto fresh = scratch("options_fresh");
  const auto refused = ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) -> std::string {
    try {
      (void)save_each_step(c, fresh, {0.25}, ddp::save_options{.keep_last = c.rank() == 0 ? 1u : 2u});
    } catch (const ddp::error& e) {
      return e.what();
    }
    return "";
  });
  check_every_rank(refused, "differ from rank 0's");
  CHECK((!fs::exists(fresh) || fs::is_empty(fresh)));
  fs::remove_all(fresh);
  fs::remove_all(dir);
}


// ---- a slot declared outside the library --------------------------------------------------

// A throwaway slot, declared here alone: its tag, two policies and its descriptor. No trainer
// file names it; a trainer takes it because a listed policy fills it and it has a descriptor.
namespace throwaway {
struct slot;
struct off {
  using slot = throwaway::slot;
  static constexpr std::string_view name = "off";
  static constexpr bool unnamed = true;  // what a trainer without the slot does
};
struct on {
  using slot = throwaway::slot;
  static constexpr std::string_view name = "on";
  int setting = 3;
};
struct slot {
  static constexpr std::string_view name = "throwaway";
  using default_policy = off;
};
}  // namespace throwaway
}  // namespace trainer_checkpoint_test

template <>
struct ddp::detail::slot_descriptor<trainer_checkpoint_test::throwaway::slot>
    : ddp::detail::unnamed_default_description {
  template <class P>
  static consteval bool check() {
    static_assert(requires { P::name; }, "a policy of the throwaway slot lacks its name");
    return true;
  }
  template <class P, class Device>
  using holder = ddp::detail::policy_holder<P>;
  template <class Device>
  using part = void;
};

namespace trainer_checkpoint_test {

TEST_CASE("a slot declared in a program: the trainer holds its policy, and a checkpoint from before it loads") {
  using with_on = ddp::trainer<test::mlp, padded, ddp::bucket_cap<256>, throwaway::on>;
  using with_off = ddp::trainer<test::mlp, padded, ddp::bucket_cap<256>, throwaway::off>;
  static_assert(std::is_same_v<with_on::policy_type<throwaway::slot>, throwaway::on>);
  CHECK(with_on::describe_policies().find("throwaway=on") != std::string::npos);
  // At its default the slot goes unnamed: the trainer describes itself as one without the slot.
  CHECK(with_off::describe_policies() == sgd_trainer::describe_policies());

  const rows data(40);
  const ddp::optim::sgd sgd{.lr = 0.1f, .momentum = 0.9f};
  const auto dir = scratch("added_slot");
  ddp::inproc::launch(2, [&](ddp::inproc::communicator& c) {  // written before the slot existed
    return run<ddp::optim::sgd, ddp::update::replicated>(c, data, 4, 3, 3, dir, false, sgd);
  });
  const auto mlp = [] { return test::make_mlp(1); };
  CHECK(load_errors<with_off>(2, dir, mlp, sgd) == std::vector<std::string>{"", ""});
  check_every_rank(load_errors<with_on>(2, dir, mlp, sgd),
                   "the checkpoint has the default throwaway, this trainer throwaway=on");
  // The policy object is the trainer's, and the slot changes nothing of the numbers.
  const auto held = ddp::inproc::launch(1, [&](ddp::inproc::communicator& c) {
    auto model = test::make_mlp(1);
    ddp::host::device dev;
    with_on t(model, c, dev, sgd);
    t.policy<throwaway::slot>().setting = 7;
    return t.policy<throwaway::slot>().setting;
  });
  CHECK(held[0] == 7);
  fs::remove_all(dir);
}

}  // namespace trainer_checkpoint_test

namespace trainer_checkpoint_test {

// The run's position in its data (trainer/epoch_position.hpp), as a load leaves it and the next
// epoch takes it up: at the world and batch size it was saved at, that epoch skips the batches
// taken; at another world size, or with batches of another size, it is re-cut from the order's
// rest and skips nothing.
TEST_CASE("epoch_position: a loaded mid-epoch position is skipped at the same world and batch size, re-cut otherwise") {
  ddp::detail::run_position saved;
  saved.policies = "saved";
  saved.seed = 7;
  saved.epochs_started = 3;  // the third epoch, 5 batches of 4 taken at world 2
  saved.batches_in_epoch = 5;
  saved.epoch_finished = false;
  saved.world = 2;
  saved.batch_size = 4;
  ddp::detail::run_counts counts;  // 10 steps of one micro-batch each
  for (int s = 0; s < 10; ++s) counts.micro_batch_begins(), counts.step_ends(), counts.step_counted();

  ddp::detail::epoch_position same(0);
  same.continue_from(saved, /*world=*/2, counts);
  CHECK(same.seed() == 7);
  CHECK(same.epochs_started() == 2);  // the interrupted epoch begins again
  CHECK(same.at(10, "now", 2).policies == "saved");  // until it does, the loaded position stands
  CHECK(same.at(10, "now", 2).batches_in_epoch == 5);
  CHECK_FALSE(same.recut(std::size_t{4}));
  const auto other_batches = same.recut(std::size_t{8});
  REQUIRE(other_batches);
  CHECK(other_batches->batches == 10);  // 5 batches on each of 2 ranks
  same.start(4);
  CHECK(same.next_epoch() == 2);
  same.started(/*shard_steps=*/false, /*recut=*/false, counts, /*length=*/20);
  CHECK(same.take_skip() == std::optional<std::uint64_t>(5));
  CHECK_FALSE(same.take_skip());
  counts.micro_batch_begins(), counts.micro_batch_begins();  // two micro-batches after the load
  const auto later = same.at(same.count(counts), "now", 2);
  CHECK(later.policies == "now");
  CHECK(later.epochs_started == 3);
  CHECK(later.batches_in_epoch == 7);
  CHECK_FALSE(later.epoch_finished);
  CHECK(same.completed_count(counts) == 10);  // neither completed a step
  CHECK(same.at(25, "now", 2).epoch_finished);

  ddp::detail::epoch_position grown(0);
  grown.continue_from(saved, /*world=*/3, counts);
  const auto cut = grown.recut(std::nullopt);
  REQUIRE(cut);
  CHECK(cut->positions == 0);
  CHECK(cut->batch_size == 4);
  grown.start(4);
  CHECK(grown.recut_offset(*cut, 4) == 40);  // 10 batches of 4 of the epoch's order taken
  grown.started(false, /*recut=*/true, counts, 3);
  CHECK_FALSE(grown.take_skip());  // the re-cut epoch holds only what was not taken
  CHECK(grown.at(grown.count(counts), "now", 3).order_offset == 40);
  CHECK(grown.at(grown.count(counts), "now", 3).batches_in_epoch == 0);
}

}  // namespace trainer_checkpoint_test
