#pragma once
// A step timeline: the phases of each training step on one rank (forward, backward, each
// bucket's pack and launch, its collective on the communication track, waits, buffer sync, the
// update), recorded when a ddp::timeline is attached to a trainer (trainer.record_timeline) and
// written as Chrome trace JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open: one
// process per rank, one thread per track. Detached (the default) a step pays one branch per
// phase and reads no clock.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ddp/comm/host_collectives.hpp"
#include "ddp/core/error.hpp"

namespace ddp {

enum class timeline_track : std::uint8_t {
  step = 0,         // the thread that runs the step: forward, backward, pack, waits, update
  collectives = 1,  // when each bucket's collective ran (the progress thread, or the stream)
};

struct timeline_event {
  std::string name;
  timeline_track track = timeline_track::step;
  std::uint64_t step = 0;  // the trainer's step count when the event began
  std::chrono::steady_clock::time_point begin, end;
};

class timeline {
 public:
  using clock = std::chrono::steady_clock;

  // Past `max_events` further events are counted, not kept: a long run cannot exhaust memory.
  explicit timeline(std::size_t max_events = std::size_t{1} << 20) : max_events_(max_events) {}

  void record(std::string name, timeline_track track, std::uint64_t step, clock::time_point begin,
              clock::time_point end) {
    if (events_.size() >= max_events_) {
      ++dropped_;
      return;
    }
    events_.push_back({std::move(name), track, step, begin, end});
  }

  const std::vector<timeline_event>& events() const noexcept { return events_; }
  std::size_t dropped() const noexcept { return dropped_; }
  void clear() noexcept {
    events_.clear();
    dropped_ = 0;
  }

 private:
  std::size_t max_events_;
  std::vector<timeline_event> events_;
  std::size_t dropped_ = 0;
};

namespace detail {

// Records [construction, destruction) as one event when a timeline is attached.
class timeline_span {
 public:
  timeline_span(timeline* t, const char* name, std::uint64_t step, timeline_track track = timeline_track::step)
      : t_(t), name_(name), step_(step), track_(track) {
    if (t_) begin_ = timeline::clock::now();
  }
  ~timeline_span() {
    if (t_) t_->record(name_, track_, step_, begin_, timeline::clock::now());
  }
  timeline_span(const timeline_span&) = delete;
  timeline_span& operator=(const timeline_span&) = delete;

 private:
  timeline* t_;
  const char* name_;
  std::uint64_t step_;
  timeline_track track_;
  timeline::clock::time_point begin_{};
};

inline void json_escape(std::string& out, const std::string& s) {
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
}

// An event as bytes, for gathering every rank's timeline on rank 0.
inline void append_event(std::vector<std::uint8_t>& out, const timeline_event& e) {
  auto put = [&](const auto& v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof v);
  };
  put(static_cast<std::uint8_t>(e.track));
  put(e.step);
  put(static_cast<std::int64_t>(e.begin.time_since_epoch().count()));
  put(static_cast<std::int64_t>(e.end.time_since_epoch().count()));
  put(static_cast<std::uint32_t>(e.name.size()));
  out.insert(out.end(), e.name.begin(), e.name.end());
}

inline std::vector<timeline_event> parse_events(std::span<const std::uint8_t> bytes) {
  std::vector<timeline_event> events;
  std::size_t at = 0;
  auto get = [&](auto& v) {
    if (at + sizeof v > bytes.size()) throw std::runtime_error("ddp: a gathered timeline is truncated");
    std::memcpy(&v, bytes.data() + at, sizeof v);
    at += sizeof v;
  };
  while (at < bytes.size()) {
    timeline_event e;
    std::uint8_t track = 0;
    std::int64_t begin = 0, end = 0;
    std::uint32_t length = 0;
    get(track), get(e.step), get(begin), get(end), get(length);
    if (at + length > bytes.size()) throw std::runtime_error("ddp: a gathered timeline is truncated");
    e.track = static_cast<timeline_track>(track);
    e.begin = timeline::clock::time_point(timeline::clock::duration(begin));
    e.end = timeline::clock::time_point(timeline::clock::duration(end));
    e.name.assign(reinterpret_cast<const char*>(bytes.data() + at), length);
    at += length;
    events.push_back(std::move(e));
  }
  return events;
}

inline void write_text_file(const std::string& path, const std::string& text, int rank) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f)
    throw error("timeline", "write", rank, "cannot write the trace to '" + path + "'; check the directory exists and is writable");
}

}  // namespace detail

// Chrome trace JSON of every rank's events (ranks[r] is rank r's): "X" (complete) events in
// microseconds from the earliest event, one process per rank ("rank r"), one thread per track.
// The clock is each process's steady clock: ranks on one host share it; across hosts their
// tracks are aligned only as well as the hosts' clocks are.
inline std::string chrome_trace(std::span<const std::vector<timeline_event>> ranks) {
  auto origin = timeline::clock::time_point::max();
  for (const auto& events : ranks)
    for (const auto& e : events) origin = std::min(origin, e.begin);
  auto micros = [&](timeline::clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t - origin).count();
  };
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  auto open = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  char buf[160];
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    open();
    std::snprintf(buf, sizeof buf, R"({"ph":"M","name":"process_name","pid":%zu,"tid":0,"args":{"name":"rank %zu"}})",
                  r, r);
    out += buf;
    for (const auto& [tid, label] : {std::pair{0, "step"}, std::pair{1, "collectives"}}) {
      open();
      std::snprintf(buf, sizeof buf, R"({"ph":"M","name":"thread_name","pid":%zu,"tid":%d,"args":{"name":"%s"}})", r,
                    tid, label);
      out += buf;
    }
    for (const auto& e : ranks[r]) {
      open();
      out += "{\"ph\":\"X\",\"name\":\"";
      detail::json_escape(out, e.name);
      std::snprintf(buf, sizeof buf, R"(","pid":%zu,"tid":%d,"ts":%.3f,"dur":%.3f,"args":{"step":%llu}})", r,
                    static_cast<int>(e.track), micros(e.begin), std::max(0.0, micros(e.end) - micros(e.begin)),
                    static_cast<unsigned long long>(e.step));
      out += buf;
    }
  }
  out += "\n]}\n";
  return out;
}

// Gathers every rank's timeline on rank 0 and writes one Chrome trace there; returns true on the
// rank that wrote. Collective: every rank calls it with its own timeline.
template <communicator C, device D>
bool write_chrome_trace(C& comm, D& dev, const timeline& mine, const std::string& path) {
  std::vector<std::uint8_t> bytes;
  for (const auto& e : mine.events()) detail::append_event(bytes, e);
  const auto size = static_cast<std::int64_t>(bytes.size());
  const auto sizes = comm::host_all_gather(comm, dev, std::span<const std::int64_t>(&size, 1));
  const auto longest = static_cast<std::size_t>(*std::max_element(sizes.begin(), sizes.end()));
  bytes.resize(longest);
  const auto all = comm::host_all_gather(comm, dev, std::span<const std::uint8_t>(bytes));
  if (comm.rank() != 0) return false;
  std::vector<std::vector<timeline_event>> ranks;
  for (std::size_t r = 0; r < sizes.size(); ++r)
    ranks.push_back(detail::parse_events(std::span(all).subspan(r * longest, static_cast<std::size_t>(sizes[r]))));
  detail::write_text_file(path, chrome_trace(ranks), comm.rank());
  return true;
}

}  // namespace ddp
