#pragma once
// A progress report for a training loop, one call per step: epoch, step, loss, samples/s and the
// time left, from rank 0 only. On a terminal one line redrawn in place (at most every 200 ms, and
// at each epoch's last step), elsewhere (a log file, a pipe) a plain line at each quarter of an
// epoch.
//
//   ddp::progress progress(comm.rank(), {.epochs = 10, .steps_per_epoch = trainer.steps_per_epoch(n, batch),
//                                        .samples_per_step = batch * comm.size(), .first_step = trainer.steps()});
//   ... progress.step(loss);   // after each trainer.step
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "ddp/core/error.hpp"

namespace ddp {

enum class progress_style {
  automatic,  // in place on a terminal, lines otherwise
  in_place,   // one line, redrawn ("\r", erase line)
  lines,      // lines_per_epoch plain lines per epoch
};

struct progress_options {
  std::size_t epochs = 0;            // the run's epochs: "epoch e/E", the time left to the run's end (0: to the epoch's)
  std::size_t steps_per_epoch = 0;   // trainer.steps_per_epoch(dataset size, batch); required
  std::size_t samples_per_step = 0;  // the global batch, for samples/s (0: not shown)
  std::uint64_t first_step = 0;      // steps taken before this report began (trainer.steps() after a load)
  std::FILE* out = stdout;           // where rank 0 writes; nullptr: nowhere
  progress_style style = progress_style::automatic;
  std::chrono::milliseconds interval{200};  // in place: redrawn at most this often
  std::size_t lines_per_epoch = 4;          // lines: at each quarter of an epoch
};

// What a report after `steps` steps in all (first_step included), `seconds` after it began, shows.
struct progress_figures {
  std::uint64_t epoch = 0;          // 1-based
  std::uint64_t step = 0;           // within the epoch, 1-based
  double samples_per_second = 0;    // over the steps since the report began
  double seconds_left = 0;          // at the mean step time so far
};

inline progress_figures progress_at(const progress_options& o, std::uint64_t steps, double seconds) {
  progress_figures f;
  if (steps == 0) return f;
  const std::uint64_t per_epoch = o.steps_per_epoch ? o.steps_per_epoch : 1;
  f.epoch = (steps - 1) / per_epoch + 1;
  f.step = (steps - 1) % per_epoch + 1;
  const std::uint64_t taken = steps > o.first_step ? steps - o.first_step : 0;
  if (taken == 0 || seconds <= 0) return f;
  f.samples_per_second = static_cast<double>(taken * o.samples_per_step) / seconds;
  const std::uint64_t end = o.epochs ? o.epochs * per_epoch : f.epoch * per_epoch;
  f.seconds_left = end > steps ? seconds / static_cast<double>(taken) * static_cast<double>(end - steps) : 0.0;
  return f;
}

// "m:ss", or "h:mm:ss" from an hour on.
inline std::string format_duration(double seconds) {
  const long t = seconds > 0 ? static_cast<long>(seconds + 0.5) : 0;
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

class progress {
 public:
  using clock = std::chrono::steady_clock;

  // Ranks other than 0 report nothing.
  progress(int rank, const progress_options& options, clock::time_point start = clock::now())
      : o_(options), out_(rank == 0 ? options.out : nullptr), start_(start), steps_(options.first_step) {
    if (o_.steps_per_epoch == 0)
      throw error("trainer", "progress", rank,
                  "progress_options::steps_per_epoch is 0: pass the steps of an epoch "
                  "(trainer.steps_per_epoch(dataset size, batch))");
    in_place_ = o_.style == progress_style::in_place ||
                (o_.style == progress_style::automatic && out_ && ::isatty(::fileno(out_)));
    if (o_.lines_per_epoch == 0) o_.lines_per_epoch = 1;
    mark_ = mark(steps_ % o_.steps_per_epoch);
  }
  progress(const progress&) = delete;
  progress& operator=(const progress&) = delete;
  ~progress() { end_line(); }

  // After each step, with the loss to show (this rank's, or a reduced one).
  void step(double loss) { step(loss, clock::now()); }
  void step(double loss, clock::time_point now) {
    ++steps_;
    if (!out_) return;
    const std::uint64_t in_epoch = (steps_ - 1) % o_.steps_per_epoch + 1;
    const bool last = in_epoch == o_.steps_per_epoch;
    if (in_place_) {
      if (!last && drawn_ && now - drawn_at_ < o_.interval) return;
      drawn_at_ = now;
    } else {
      const std::uint64_t m = mark(in_epoch);
      if (m == mark_ || m == 0) return;
    }
    mark_ = last ? 0 : mark(in_epoch);
    print(loss, std::chrono::duration<double>(now - start_).count(), last);
  }

  // Ends a line drawn in place (before printing something else mid-epoch, or after a loop that
  // stopped early); the destructor does it too, so `out` must outlive the report.
  void end_line() {
    if (out_ && drawn_) {
      std::fputc('\n', out_);
      std::fflush(out_);
    }
    drawn_ = false;
  }

  std::uint64_t steps() const noexcept { return steps_; }

 private:
  // Which of the epoch's lines_per_epoch parts `in_epoch` steps have completed.
  std::uint64_t mark(std::uint64_t in_epoch) const { return in_epoch * o_.lines_per_epoch / o_.steps_per_epoch; }

  void print(double loss, double seconds, bool last_of_epoch) {
    const auto f = progress_at(o_, steps_, seconds);
    char epoch[48], rate[48] = "";
    if (o_.epochs) std::snprintf(epoch, sizeof epoch, "epoch %llu/%zu", static_cast<unsigned long long>(f.epoch), o_.epochs);
    else std::snprintf(epoch, sizeof epoch, "epoch %llu", static_cast<unsigned long long>(f.epoch));
    if (o_.samples_per_step) std::snprintf(rate, sizeof rate, "  %.0f samples/s", f.samples_per_second);
    std::string bar;
    if (in_place_) {  // 16 cells of the epoch
      const std::size_t filled = static_cast<std::size_t>(f.step * 16 / o_.steps_per_epoch);
      bar = "  [" + std::string(filled, '#') + std::string(16 - filled, '.') + "]";
    }
    std::fprintf(out_, "%s%s%s  step %llu/%zu  loss %.4f%s  ETA %s%s", in_place_ ? "\r\033[2K" : "", epoch, bar.c_str(),
                 static_cast<unsigned long long>(f.step), o_.steps_per_epoch, loss, rate,
                 format_duration(f.seconds_left).c_str(), in_place_ && !last_of_epoch ? "" : "\n");
    std::fflush(out_);
    drawn_ = in_place_ && !last_of_epoch;
  }

  progress_options o_;
  std::FILE* out_;
  clock::time_point start_, drawn_at_{};
  std::uint64_t steps_;
  std::uint64_t mark_ = 0;  // lines: the part of the epoch last reported
  bool in_place_ = false;
  bool drawn_ = false;  // in place: a line is open (no newline yet)
};

}  // namespace ddp
