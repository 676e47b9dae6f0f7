#pragma once
// One rank's checkpoint file, and the directory that holds a checkpoint of every rank.
//
// File: "DDPCKPT1", the body's length (u64), the body, its CRC-32 (u32). The body is a list of
// named sections (u32 name length, name, u64 size, bytes): text fields ("meta/...") and arrays
// (parameters, buffers, optimizer state). A short file, a wrong length or a wrong checksum is an
// error naming the file; nothing is read from a file that fails them.
//
// Directory: step-<steps>/rank-<r>-of-<world>.ddpckpt for every rank, and LATEST naming the
// step directory of the last complete checkpoint, then listing every committed one (the index).
// Each file is written to a temporary name, flushed to disk and renamed; LATEST is written the
// same way only after every rank's file is there, so a crash at any point leaves the previous
// checkpoint whole and LATEST pointing at it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <span>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/files.hpp"

namespace ddp {

// One committed checkpoint of a directory (ddp::committed_checkpoints).
struct checkpoint_info {
  std::uint64_t steps = 0;        // the trainer's step count when it was saved: trainer.load(dir, steps)
  int world = 0;                  // the ranks that saved it
  std::optional<double> metric{}; // the save's metric (save_options::metric), if it had one
  bool operator==(const checkpoint_info&) const = default;
};

}  // namespace ddp

namespace ddp::detail {

inline std::uint32_t crc32(std::span<const std::uint8_t> bytes) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t c = 0xFFFFFFFFu;
  for (auto b : bytes) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

class checkpoint_file {
 public:
  static constexpr std::string_view magic = "DDPCKPT1";

  void set_text(const std::string& name, const std::string& value) {
    sections_["meta/" + name].assign(value.begin(), value.end());
  }
  template <class T>
  void set_array(const std::string& name, std::span<const T> values) {
    auto& s = sections_[name];
    s.resize(values.size_bytes());
    if (!values.empty()) std::memcpy(s.data(), values.data(), values.size_bytes());
  }
  void set_bytes(const std::string& name, std::vector<std::uint8_t> bytes) { sections_[name] = std::move(bytes); }

  bool has(const std::string& name) const { return sections_.count(name) != 0; }
  std::string text(const std::string& name) const {
    const auto& s = section("meta/" + name);
    return {s.begin(), s.end()};
  }
  std::uint64_t number(const std::string& name) const {
    const auto t = text(name);
    try {
      return std::stoull(t);
    } catch (...) {
      throw error("trainer", "load", -1, "'" + path_ + "': field " + name + " is not a number: '" + t + "'");
    }
  }
  const std::vector<std::uint8_t>& section(const std::string& name) const {
    const auto it = sections_.find(name);
    if (it == sections_.end())
      throw error("trainer", "load", -1, "'" + path_ + "' has no section '" + name + "' (written by another version?)");
    return it->second;
  }
  // The section as `count` values of T; a different size is an error naming it.
  template <class T>
  std::vector<T> array(const std::string& name, std::size_t count) const {
    const auto& s = section(name);
    if (s.size() != count * sizeof(T))
      throw error("trainer", "load", -1,
                  "'" + path_ + "': section '" + name + "' holds " + std::to_string(s.size()) + " bytes, this model needs " +
                      std::to_string(count * sizeof(T)));
    std::vector<T> out(count);
    if (count) std::memcpy(out.data(), s.data(), s.size());
    return out;
  }
  const std::string& path() const noexcept { return path_; }

  std::vector<std::uint8_t> encode() const {
    std::vector<std::uint8_t> body;
    auto put = [&body](const void* p, std::size_t n) {
      const auto* b = static_cast<const std::uint8_t*>(p);
      body.insert(body.end(), b, b + n);
    };
    for (const auto& [name, bytes] : sections_) {
      const auto name_size = static_cast<std::uint32_t>(name.size());
      const auto size = static_cast<std::uint64_t>(bytes.size());
      put(&name_size, 4);
      put(name.data(), name.size());
      put(&size, 8);
      put(bytes.data(), bytes.size());
    }
    std::vector<std::uint8_t> out(magic.begin(), magic.end());
    const auto length = static_cast<std::uint64_t>(body.size());
    const auto* l = reinterpret_cast<const std::uint8_t*>(&length);
    out.insert(out.end(), l, l + 8);
    out.insert(out.end(), body.begin(), body.end());
    const std::uint32_t crc = crc32(body);
    const auto* c = reinterpret_cast<const std::uint8_t*>(&crc);
    out.insert(out.end(), c, c + 4);
    return out;
  }

  static checkpoint_file decode(std::span<const std::uint8_t> bytes, const std::string& path) {
    auto fail = [&](const std::string& what) -> void {
      throw error("trainer", "load", -1, "'" + path + "' " + what + "; the checkpoint cannot be used");
    };
    if (bytes.size() < magic.size() + 12 || std::memcmp(bytes.data(), magic.data(), magic.size()) != 0)
      fail(bytes.size() < magic.size() ? "is not a ddp checkpoint (" + std::to_string(bytes.size()) + " bytes)"
                                       : "is not a ddp checkpoint (no DDPCKPT1 header)");
    std::uint64_t length = 0;
    std::memcpy(&length, bytes.data() + magic.size(), 8);
    const std::size_t head = magic.size() + 8;
    if (length > bytes.size() || bytes.size() != head + length + 4)
      fail("is truncated or has trailing bytes: its header says " + std::to_string(head + length + 4) +
           " bytes, the file has " + std::to_string(bytes.size()));
    const auto body = bytes.subspan(head, static_cast<std::size_t>(length));
    std::uint32_t stored = 0;
    std::memcpy(&stored, bytes.data() + head + length, 4);
    if (crc32(body) != stored) fail("is corrupt: its checksum does not match its contents");
    checkpoint_file f;
    f.path_ = path;
    std::size_t at = 0;
    auto take = [&](void* p, std::size_t n) {
      if (at + n > body.size()) fail("is corrupt: a section runs past the end");
      if (n) std::memcpy(p, body.data() + at, n);  // an empty section has no storage to copy into
      at += n;
    };
    auto fits = [&](std::uint64_t n) {  // checked before anything of that size is allocated
      if (n > body.size() - at) fail("is corrupt: a section runs past the end");
    };
    while (at < body.size()) {
      std::uint32_t name_size = 0;
      std::uint64_t size = 0;
      take(&name_size, 4);
      fits(name_size);
      std::string name(name_size, '\0');
      take(name.data(), name_size);
      take(&size, 8);
      fits(size);
      std::vector<std::uint8_t> s(static_cast<std::size_t>(size));
      take(s.data(), s.size());
      if (!f.sections_.emplace(std::move(name), std::move(s)).second) fail("is corrupt: a section appears twice");
    }
    return f;
  }

 private:
  std::string path_;
  std::map<std::string, std::vector<std::uint8_t>> sections_;
};

// LATEST: "step-N WORLD" (the checkpoint trainer.load(dir) reads), then one line per committed
// checkpoint, oldest save first, the latest last: "checkpoint step-N WORLD METRIC" (METRIC "-"
// for none). A LATEST of the first line alone lists only that checkpoint.
struct checkpoint_directory {
  std::filesystem::path root;

  static std::string step_name(std::uint64_t steps) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "step-%012llu", static_cast<unsigned long long>(steps));
    return buf;
  }
  std::filesystem::path rank_file(const std::string& step, int rank, int world) const {
    return root / step / ("rank-" + std::to_string(rank) + "-of-" + std::to_string(world) + ".ddpckpt");
  }
  std::filesystem::path latest() const { return root / "LATEST"; }

  // The committed checkpoint: its step directory and world size; nullopt when there is none.
  std::optional<std::pair<std::string, int>> committed() const {
    const auto all = index();
    if (all.empty()) return std::nullopt;
    return std::make_pair(step_name(all.back().steps), all.back().world);
  }

  // Every committed checkpoint, oldest save first (the last is the one LATEST names); empty when
  // there is no LATEST.
  std::vector<checkpoint_info> index() const {
    std::ifstream in(latest());
    if (!in) return {};
    std::string line;
    std::getline(in, line);
    const auto head = entry(line, false);
    std::vector<checkpoint_info> all;
    while (std::getline(in, line))
      if (!line.empty()) all.push_back(entry(line, true));
    if (all.empty() || all.back().steps != head.steps || all.back().world != head.world) {
      if (!all.empty())
        throw error("trainer", "load", -1,
                    "'" + latest().string() + "' names " + step_name(head.steps) +
                        " but does not list it last; the index is damaged: write LATEST's first line as the last "
                        "'checkpoint' line, or remove those lines");
      all.push_back(head);
    }
    return all;
  }

  // LATEST's text for `all`, the last of which becomes the one trainer.load(dir) reads.
  static std::string index_text(const std::vector<checkpoint_info>& all) {
    std::string out = step_name(all.back().steps) + " " + std::to_string(all.back().world) + "\n";
    for (const auto& c : all) {
      char metric[32] = "-";
      if (c.metric) std::snprintf(metric, sizeof metric, "%.17g", *c.metric);
      out += "checkpoint " + step_name(c.steps) + " " + std::to_string(c.world) + " " + metric + "\n";
    }
    return out;
  }

 private:
  // "step-N WORLD", or with `listed` "checkpoint step-N WORLD METRIC".
  checkpoint_info entry(const std::string& line, bool listed) const {
    std::istringstream in(line);
    std::string word, step, metric = "-";
    checkpoint_info c;
    const bool read = listed ? (in >> word >> step >> c.world >> metric) && word == "checkpoint"
                             : static_cast<bool>(in >> step >> c.world);
    const bool step_ok = step.size() > 5 && step.size() <= 5 + 19 && step.rfind("step-", 0) == 0 &&
                         step.find_first_not_of("0123456789", 5) == std::string::npos;
    char* end = nullptr;
    if (metric != "-") c.metric = std::strtod(metric.c_str(), &end);
    if (!read || !step_ok || c.world < 1 || (c.metric && *end != '\0'))
      throw error("trainer", "load", -1,
                  "'" + latest().string() + "' is not a ddp checkpoint index: the line '" + line + "' is not '" +
                      (listed ? "checkpoint step-N WORLD METRIC" : "step-N WORLD") + "'");
    c.steps = std::stoull(step.substr(5));
    return c;
  }
};

// N numbers per row of a text section ("1 2 3\n4 5 6\n"), as rows; reading stops at the first
// row that is not whole.
template <std::size_t N>
std::vector<std::array<std::size_t, N>> number_rows(const std::string& text) {
  std::vector<std::array<std::size_t, N>> rows;
  std::istringstream in(text);
  for (std::array<std::size_t, N> r{};;) {
    for (auto& v : r)
      if (!(in >> v)) return rows;
    rows.push_back(r);
  }
}

}  // namespace ddp::detail
