// The progress report: its figures as a pure function, its lines on a file (a fake clock), on
// rank 0 only.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "ddp/trainer/progress.hpp"

namespace trainer_progress_test {

namespace {

using namespace std::chrono_literals;

// What `report` wrote into a temporary file, after `steps` steps of `seconds_per_step` each
// with loss 0.5 + step / 100.
std::string written(int rank, ddp::progress_options o, std::size_t steps, std::chrono::milliseconds per_step) {
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  o.out = f;
  const auto start = ddp::progress::clock::time_point{};
  {
    ddp::progress report(rank, o, start);
    for (std::size_t i = 1; i <= steps; ++i)
      report.step(0.5 + static_cast<double>(i) / 100, start + per_step * static_cast<long>(i));
  }
  std::string text(static_cast<std::size_t>(std::ftell(f)), '\0');
  std::rewind(f);
  text.resize(std::fread(text.data(), 1, text.size(), f));
  std::fclose(f);
  return text;
}

}  // namespace

TEST_CASE("progress figures: epoch and step from the step count, samples/s and the time left from the steps taken") {
  const ddp::progress_options o{.epochs = 3, .steps_per_epoch = 10, .samples_per_step = 64};
  auto f = ddp::progress_at(o, 4, 2.0);  // 4 of 30 steps in 2 s
  CHECK(f.epoch == 1);
  CHECK(f.step == 4);
  CHECK(f.samples_per_second == doctest::Approx(4 * 64 / 2.0));
  CHECK(f.seconds_left == doctest::Approx(26 * 0.5));
  f = ddp::progress_at(o, 10, 5.0);
  CHECK((f.epoch == 1 && f.step == 10));
  f = ddp::progress_at(o, 11, 5.5);
  CHECK((f.epoch == 2 && f.step == 1));
  // Resumed at step 20: the rate and the time left count only the steps taken since.
  f = ddp::progress_at({.epochs = 3, .steps_per_epoch = 10, .samples_per_step = 64, .first_step = 20}, 25, 1.0);
  CHECK((f.epoch == 3 && f.step == 5));
  CHECK(f.samples_per_second == doctest::Approx(5 * 64));
  CHECK(f.seconds_left == doctest::Approx(5 * 0.2));
  // Epochs not given: the time left is to the end of this epoch; past the end, none.
  CHECK(ddp::progress_at({.steps_per_epoch = 10}, 14, 1.4).seconds_left == doctest::Approx(0.6));
  CHECK(ddp::progress_at(o, 31, 3.1).seconds_left == 0);

  CHECK(ddp::format_duration(0) == "0:00");
  CHECK(ddp::format_duration(65.4) == "1:05");
  CHECK(ddp::format_duration(3600 + 61) == "1:01:01");
  CHECK(ddp::format_duration(-3) == "0:00");
}

TEST_CASE("progress as lines: one at each quarter of an epoch, on rank 0 only") {
  const ddp::progress_options o{.epochs = 2, .steps_per_epoch = 8, .samples_per_step = 100,
                                .style = ddp::progress_style::lines};
  const std::string text = written(0, o, 16, 500ms);
  CHECK(text ==
        "epoch 1/2  step 2/8  loss 0.5200  200 samples/s  ETA 0:07\n"
        "epoch 1/2  step 4/8  loss 0.5400  200 samples/s  ETA 0:06\n"
        "epoch 1/2  step 6/8  loss 0.5600  200 samples/s  ETA 0:05\n"
        "epoch 1/2  step 8/8  loss 0.5800  200 samples/s  ETA 0:04\n"
        "epoch 2/2  step 2/8  loss 0.6000  200 samples/s  ETA 0:03\n"
        "epoch 2/2  step 4/8  loss 0.6200  200 samples/s  ETA 0:02\n"
        "epoch 2/2  step 6/8  loss 0.6400  200 samples/s  ETA 0:01\n"
        "epoch 2/2  step 8/8  loss 0.6600  200 samples/s  ETA 0:00\n");
  CHECK(written(1, o, 16, 500ms).empty());
  // Epochs fewer than four steps: a line per step; more lines per epoch when asked.
  auto short_epochs = o;
  short_epochs.steps_per_epoch = 3;
  CHECK(written(0, short_epochs, 3, 500ms) ==
        "epoch 1/2  step 1/3  loss 0.5100  200 samples/s  ETA 0:03\n"
        "epoch 1/2  step 2/3  loss 0.5200  200 samples/s  ETA 0:02\n"
        "epoch 1/2  step 3/3  loss 0.5300  200 samples/s  ETA 0:02\n");
  auto every_step = o;
  every_step.lines_per_epoch = 8;
  CHECK(written(0, every_step, 16, 500ms).size() == 16 * std::string("epoch 1/2  step 2/8  loss 0.5200  200 samples/s  ETA 0:07\n").size());
  // Resumed after one epoch, without a rate: the second epoch's lines, the same quarters.
  auto resumed = o;
  resumed.first_step = 8;
  resumed.samples_per_step = 0;
  CHECK(written(0, resumed, 2, 500ms) == "epoch 2/2  step 2/8  loss 0.5200  ETA 0:03\n");
}

TEST_CASE("progress in place: redrawn at most every interval and at each epoch's end, a newline after it") {
  const ddp::progress_options o{.epochs = 1, .steps_per_epoch = 6, .samples_per_step = 10,
                                .style = ddp::progress_style::in_place};
  // A step each 150 ms: drawn at steps 1, 3, 5 (200 ms apart or more) and 6 (the epoch's last).
  const std::string text = written(0, o, 6, 150ms);
  const std::string erase = "\r\033[2K";
  CHECK(text == erase + "epoch 1/1  [##..............]  step 1/6  loss 0.5100  67 samples/s  ETA 0:01" +
                    erase + "epoch 1/1  [########........]  step 3/6  loss 0.5300  67 samples/s  ETA 0:00" +
                    erase + "epoch 1/1  [#############...]  step 5/6  loss 0.5500  67 samples/s  ETA 0:00" +
                    erase + "epoch 1/1  [################]  step 6/6  loss 0.5600  67 samples/s  ETA 0:00\n");
  CHECK(written(1, o, 6, 150ms).empty());
  // A loop that stops mid-epoch: the destructor ends the line.
  const std::string stopped = written(0, o, 2, 300ms);
  CHECK(stopped.back() == '\n');
  CHECK(stopped.find("step 2/6") != std::string::npos);
  // A file is not a terminal: automatic gives lines.
  auto automatic = o;
  automatic.style = ddp::progress_style::automatic;
  CHECK(written(0, automatic, 6, 150ms).find('\r') == std::string::npos);

  CHECK_THROWS_WITH_AS(ddp::progress(0, {.epochs = 1}), doctest::Contains("progress_options::steps_per_epoch is 0"),
                       ddp::error);
}

}  // namespace trainer_progress_test
