#pragma once
// The flight recorder every communicator holds: the last N collectives this rank issued, each
// with its sequence id, op, count, dtype, root, reduce op, the trainer's tag (step, bucket,
// purpose) and its state (issued, started, completed) with times. When the ranks hang or fail
// because they issued different collectives, each rank's record says what it issued; `ddp-why`
// reads every rank's dump and names the first collective where they differ (docs/debugging.md).
//
// Settings (recorder_options, or the environment when the communicator is given none):
//   DDP_FLIGHT_RECORDER_ENTRIES   entries kept per communicator (default 2000; 0 turns it off)
//   DDP_FLIGHT_RECORDER_DIR       where dumps go: <dir>/<backend>.rank<r>.jsonl (empty: no dumps)
// A rank dumps on its first failure (a timeout, a peer's failure, its own abort; dump_once) and,
// while a dump folder is set, on SIGUSR1 (every recorder of the process, from a thread of the
// recorder's own: the signal handler only wakes it). A dump is written to a file of its own and
// renamed into place, so a reader never sees half of one, however many threads dump at once.
//
// The tag comes from the thread that issues the collective: a tag_scope (the purpose, and the
// bucket) and a step_scope (the step) set it for every collective that thread issues while they
// live, on every communicator.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ddp/core/dtype.hpp"
#include "ddp/core/reduce_op.hpp"

namespace ddp::comm {

// What a collective is for, as the trainer says where it issues it.
enum class purpose : std::uint8_t {
  unspecified,
  buffer_sync,           // the module's buffers (broadcast, average)
  control,               // the trainer's control floats (unused parameters, step verdicts)
  gradients,             // a bucket's gradients
  gather,                // parameters gathered (sharded updates), or a host-side gather
  checkpoint_agreement,  // the ranks agree on a checkpoint
  handover,              // elastic training's hand-over to a new membership
  fingerprint,           // the checking mode's agreement on the next collective
  sync,                  // a sync schedule's sync: parameters or pseudo-gradients averaged
  policy_agreement,      // the ranks agree on the trainer's policies (one_of choices included)
};

constexpr std::string_view name_of(purpose p) noexcept {
  switch (p) {
    case purpose::unspecified: return "unspecified";
    case purpose::buffer_sync: return "buffer_sync";
    case purpose::control: return "control";
    case purpose::gradients: return "gradients";
    case purpose::gather: return "gather";
    case purpose::checkpoint_agreement: return "checkpoint_agreement";
    case purpose::handover: return "handover";
    case purpose::fingerprint: return "fingerprint";
    case purpose::sync: return "sync";
    case purpose::policy_agreement: return "policy_agreement";
  }
  return "?";
}

struct collective_tag {
  std::int64_t step = -1;    // the trainer's step (-1: outside a step)
  std::int32_t bucket = -1;  // the gradient bucket (-1: none)
  purpose what = purpose::unspecified;
  friend bool operator==(const collective_tag&, const collective_tag&) = default;
};

namespace detail {
inline thread_local collective_tag thread_tag{};
}  // namespace detail

// The tag of the collectives this thread issues now.
inline collective_tag current_tag() noexcept { return detail::thread_tag; }

// Tags the collectives this thread issues while it lives with `what` (and `bucket`); the step
// stays. Restores the previous tag when it ends.
class tag_scope {
 public:
  explicit tag_scope(purpose what, std::int32_t bucket = -1) noexcept : saved_(detail::thread_tag) {
    detail::thread_tag.what = what;
    detail::thread_tag.bucket = bucket;
  }
  tag_scope(const tag_scope&) = delete;
  tag_scope& operator=(const tag_scope&) = delete;
  ~tag_scope() { detail::thread_tag = saved_; }

 private:
  collective_tag saved_;
};

// Tags the collectives this thread issues while it lives with `step`.
class step_scope {
 public:
  explicit step_scope(std::int64_t step) noexcept : saved_(detail::thread_tag) { detail::thread_tag.step = step; }
  step_scope(const step_scope&) = delete;
  step_scope& operator=(const step_scope&) = delete;
  ~step_scope() { detail::thread_tag = saved_; }

 private:
  collective_tag saved_;
};

enum class collective_state : std::uint8_t { issued, started, completed };

constexpr std::string_view name_of(collective_state s) noexcept {
  switch (s) {
    case collective_state::issued: return "issued";
    case collective_state::started: return "started";
    case collective_state::completed: return "completed";
  }
  return "?";
}

struct flight_entry {
  std::uint64_t sequence = 0;
  const char* op = "";  // a literal: all_reduce, broadcast, ...
  std::uint64_t count = 0;
  dtype type = dtype::u8;
  reduce_op reduction = reduce_op::sum;
  int root = -1;  // -1: the op has no root
  collective_tag tag;
  collective_state state = collective_state::issued;
  std::chrono::steady_clock::time_point issued_at{}, started_at{}, completed_at{};
};

struct recorder_options {
  static constexpr std::size_t default_entries = 2000;
  std::size_t entries = default_entries;  // 0: the recorder is off
  std::string dump_dir;                   // empty: no dumps
  bool dump_on_signal = true;             // SIGUSR1 dumps (when dump_dir is set)

  // DDP_FLIGHT_RECORDER_ENTRIES and DDP_FLIGHT_RECORDER_DIR, or the defaults.
  static recorder_options from_environment() {
    recorder_options o;
    if (const char* n = std::getenv("DDP_FLIGHT_RECORDER_ENTRIES"); n && *n) {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(n, &end, 10);
      if (end && *end == '\0') o.entries = static_cast<std::size_t>(v);
    }
    if (const char* d = std::getenv("DDP_FLIGHT_RECORDER_DIR")) o.dump_dir = d;
    return o;
  }
};

class flight_recorder;

namespace detail {

// The pipe's write end the SIGUSR1 handler writes to (a lock-free atomic: async-signal-safe).
inline std::atomic<int> signal_pipe{-1};
static_assert(std::atomic<int>::is_always_lock_free);

// The recorders of this process that dump on SIGUSR1, and the thread that dumps them: the signal
// handler writes one byte to a pipe (async-signal-safe), the thread reads it and dumps. Made once
// and never destroyed, so the thread outlives every recorder.
class signal_dumper {
 public:
  static signal_dumper& get() {
    static signal_dumper* d = new signal_dumper;
    return *d;
  }
  void add(flight_recorder* r) {
    std::lock_guard lock(mutex_);
    live_.push_back(r);
  }
  void remove(flight_recorder* r) {
    std::lock_guard lock(mutex_);  // waits for a dump in progress
    live_.erase(std::remove(live_.begin(), live_.end(), r), live_.end());
  }

 private:
  signal_dumper() {
    if (::pipe(fds_) != 0) return;
    struct sigaction current {};
    if (sigaction(SIGUSR1, nullptr, &current) != 0) return;
    // A program's own SIGUSR1 handler stays: ddp installs its own only where none is.
    if (current.sa_handler != SIG_DFL || (current.sa_flags & SA_SIGINFO)) return;
    signal_pipe.store(fds_[1]);
    std::thread([this] { run(); }).detach();
    struct sigaction act {};
    act.sa_handler = &on_signal;
    sigemptyset(&act.sa_mask);
    act.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &act, nullptr);
  }
  static void on_signal(int) {
    const int saved = errno;
    const char byte = 1;
    if (const int fd = signal_pipe.load(); fd >= 0) {
      [[maybe_unused]] const auto n = ::write(fd, &byte, 1);
    }
    errno = saved;
  }
  void run();

  int fds_[2] = {-1, -1};
  std::mutex mutex_;
  std::vector<flight_recorder*> live_;
};

// `s` as a JSON string's contents.
inline void append_json_escaped(std::string& out, std::string_view s) {
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
}

}  // namespace detail

class flight_recorder {
 public:
  using clock = std::chrono::steady_clock;

  flight_recorder(std::string_view backend, int rank, int size,
                  recorder_options opts = recorder_options::from_environment())
      : backend_(backend), rank_(rank), size_(size), options_(std::move(opts)), ring_(options_.entries) {
    if (signals()) detail::signal_dumper::get().add(this);
  }
  flight_recorder(const flight_recorder&) = delete;
  flight_recorder& operator=(const flight_recorder&) = delete;
  ~flight_recorder() {
    if (signals()) detail::signal_dumper::get().remove(this);
  }

  bool enabled() const noexcept { return !ring_.empty(); }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const recorder_options& settings() const noexcept { return options_; }

  // The id of a collective left out of the record: the checking mode's agreement on the next one.
  static constexpr std::uint64_t unrecorded = ~std::uint64_t{0};

  // Records a collective this thread issues, with the thread's tag; returns its sequence id
  // (counted also while the recorder is off: every rank's collectives have the same ids).
  // Collectives tagged purpose::fingerprint are left out (unrecorded), so the ids count the
  // same collectives with the checking mode as without it.
  std::uint64_t issued(const char* op, std::size_t count, dtype type, reduce_op reduction = reduce_op::sum,
                       int root = -1) {
    if (detail::thread_tag.what == purpose::fingerprint) return unrecorded;
    if (ring_.empty()) return next_.fetch_add(1, std::memory_order_relaxed);
    const auto now = clock::now();
    std::lock_guard lock(mutex_);
    const std::uint64_t sequence = next_.fetch_add(1, std::memory_order_relaxed);
    ring_[sequence % ring_.size()] = flight_entry{sequence, op,    count, type, reduction, root, current_tag(),
                                                  collective_state::issued, now, {}, {}};
    return sequence;
  }
  void started(std::uint64_t sequence) { advance(sequence, collective_state::started); }
  void completed(std::uint64_t sequence) { advance(sequence, collective_state::completed); }

  // The next collective's sequence id.
  std::uint64_t next_sequence() const noexcept { return next_.load(std::memory_order_relaxed); }

  // The entries kept, oldest first.
  std::vector<flight_entry> entries() const {
    std::lock_guard lock(mutex_);
    std::vector<flight_entry> out;
    const std::uint64_t n = next_.load(std::memory_order_relaxed);
    const std::uint64_t kept = std::min<std::uint64_t>(n, ring_.size());
    out.reserve(kept);
    for (std::uint64_t s = n - kept; s < n; ++s) out.push_back(ring_[s % ring_.size()]);
    return out;
  }

  // Where this rank's dump goes (empty: no dump folder).
  std::string dump_path() const {
    if (options_.dump_dir.empty()) return {};
    return options_.dump_dir + "/" + backend_ + ".rank" + std::to_string(rank_) + ".jsonl";
  }

  // Writes the record, with `reason`, to dump_path() (making the folder if needed); false when
  // there is no dump folder, or the file could not be written. Safe from any thread, while
  // collectives run.
  bool dump(std::string_view reason) const {
    const std::string path = dump_path();
    if (path.empty() || !enabled()) return false;
    const std::string text = render(reason);
    std::error_code missing;
    std::filesystem::create_directories(options_.dump_dir, missing);  // a failure shows at fopen
    static std::atomic<unsigned> counter{0};
    const std::string temporary = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    std::FILE* f = std::fopen(temporary.c_str(), "w");
    if (!f) return false;
    const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !written || std::rename(temporary.c_str(), path.c_str()) != 0) {
      std::remove(temporary.c_str());
      return false;
    }
    return true;
  }

  // Dumps once: at the first failure this rank sees (later collectives fail with the same one).
  void dump_once(std::string_view reason) {
    if (!dumped_.exchange(true)) dump(reason);
  }

  // The dump's text: a header line, one line per entry (oldest first), an end line.
  std::string render(std::string_view reason) const {
    const auto entries = this->entries();
    const auto steady_now = clock::now();
    const auto unix_now = std::chrono::duration_cast<std::chrono::microseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
    const auto unix_us = [&](clock::time_point t) -> long long {
      if (t == clock::time_point{}) return -1;
      return unix_now - std::chrono::duration_cast<std::chrono::microseconds>(steady_now - t).count();
    };
    std::string out = "{\"ddp_flight_recorder\":1,\"backend\":\"";
    detail::append_json_escaped(out, backend_);
    out += "\",\"rank\":" + std::to_string(rank_) + ",\"world\":" + std::to_string(size_) +
           ",\"pid\":" + std::to_string(::getpid()) + ",\"capacity\":" + std::to_string(ring_.size()) +
           ",\"issued\":" + std::to_string(next_sequence()) + ",\"dumped_us\":" + std::to_string(unix_now) +
           ",\"reason\":\"";
    detail::append_json_escaped(out, reason);
    out += "\"}\n";
    for (const auto& e : entries) {
      out += "{\"seq\":" + std::to_string(e.sequence) + ",\"op\":\"" + e.op + "\",\"count\":" + std::to_string(e.count) +
             ",\"dtype\":\"" + std::string(name_of(e.type)) + "\",\"reduce_op\":\"" + std::string(name_of(e.reduction)) +
             "\",\"root\":" + std::to_string(e.root) + ",\"step\":" + std::to_string(e.tag.step) +
             ",\"bucket\":" + std::to_string(e.tag.bucket) + ",\"purpose\":\"" + std::string(name_of(e.tag.what)) +
             "\",\"state\":\"" + std::string(name_of(e.state)) + "\",\"issued_us\":" + std::to_string(unix_us(e.issued_at)) +
             ",\"started_us\":" + std::to_string(unix_us(e.started_at)) +
             ",\"completed_us\":" + std::to_string(unix_us(e.completed_at)) + "}\n";
    }
    out += "{\"end\":" + std::to_string(entries.size()) + "}\n";
    return out;
  }

 private:
  bool signals() const { return enabled() && options_.dump_on_signal && !options_.dump_dir.empty(); }

  void advance(std::uint64_t sequence, collective_state state) {
    if (ring_.empty() || sequence == unrecorded) return;
    const auto now = clock::now();
    std::lock_guard lock(mutex_);
    auto& e = ring_[sequence % ring_.size()];
    if (e.sequence != sequence || e.state >= state) return;  // overwritten since, or already there
    e.state = state;
    (state == collective_state::started ? e.started_at : e.completed_at) = now;
    if (state == collective_state::completed && e.started_at == clock::time_point{}) e.started_at = now;
  }

  std::string backend_;
  int rank_, size_;
  recorder_options options_;
  mutable std::mutex mutex_;
  std::vector<flight_entry> ring_;
  std::atomic<std::uint64_t> next_{0};
  std::atomic<bool> dumped_{false};
};

inline void detail::signal_dumper::run() {
  for (;;) {
    char byte = 0;
    const auto n = ::read(fds_[0], &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    std::lock_guard lock(mutex_);
    for (const flight_recorder* r : live_) r->dump("SIGUSR1");
  }
}

}  // namespace ddp::comm
