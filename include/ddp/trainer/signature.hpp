#pragma once
// Pitfall P5: ranks must hold the same model. Each rank's list of (kind, name, dtype, shape)
// is hashed and compared; on a mismatch every rank reports the first entry that differs from
// rank 0's list.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/core/tensor.hpp"
#include "ddp/trainer/consensus.hpp"

namespace ddp::detail {

struct signature_entry {
  std::string kind;  // "parameter" or "buffer"
  std::string name;
  dtype type;
  shape_t shape;

  std::string describe() const {
    return kind + " '" + name + "' " + std::string(name_of(type)) + " " + to_string(shape);
  }
  std::string serialize() const { return describe() + "\n"; }
};

// Two lists of entries compared in order: the first position where they differ, each side's
// entry there ("nothing" past its end). The same-model check and a checkpoint's refusals name it.
struct list_difference {
  std::size_t index;
  std::string first, second;
};
inline std::optional<list_difference> first_difference(const std::vector<std::string>& a,
                                                       const std::vector<std::string>& b) {
  for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    std::string x = i < a.size() ? a[i] : "nothing", y = i < b.size() ? b[i] : "nothing";
    if (x != y) return list_difference{i, std::move(x), std::move(y)};
  }
  return std::nullopt;
}

// The lines of a text, without their '\n' (a serialized signature: one entry per line).
inline std::vector<std::string> lines_of(std::string_view text) {
  std::vector<std::string> out;
  std::string line;
  for (char c : text)
    if (c == '\n') out.push_back(std::exchange(line, {}));
    else line += c;
  return out;
}

inline std::string serialize(const std::vector<signature_entry>& entries) {
  std::string text;
  for (const auto& e : entries) text += e.serialize();
  return text;
}

inline std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

template <communicator C, device D>
void check_same_model(C& comm, D& dev, const std::vector<signature_entry>& entries) {
  const std::string text = serialize(entries);
  const auto hash = static_cast<std::int64_t>(fnv1a(text));
  auto hashes = comm::host_all_gather(comm, dev, std::span<const std::int64_t>(&hash, 1));
  if (std::all_of(hashes.begin(), hashes.end(), [&](auto h) { return h == hashes[0]; })) return;

  std::int64_t length = static_cast<std::int64_t>(text.size());
  comm::host_broadcast(comm, dev, std::span<std::int64_t>(&length, 1), 0);
  std::vector<std::uint8_t> reference(static_cast<std::size_t>(length));
  if (comm.rank() == 0) std::copy(text.begin(), text.end(), reference.begin());
  comm::host_broadcast(comm, dev, std::span<std::uint8_t>(reference), 0);

  std::optional<std::string> problem;
  if (const auto d = first_difference(lines_of(text), lines_of({reinterpret_cast<const char*>(reference.data()),
                                                                 reference.size()})))
    problem = "its model differs from rank 0's (pitfall P5): entry " + std::to_string(d->index) + " is " + d->first +
              ", but on rank 0 it is " + d->second;
  agree_or_throw(comm, dev, problem, "construct",
                 "ranks hold different models: build the same module, with the same parameter and buffer names, "
                 "dtypes and shapes, on every rank");
}

}  // namespace ddp::detail
