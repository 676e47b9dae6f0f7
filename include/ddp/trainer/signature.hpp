#pragma once
// Pitfall P5: ranks must hold the same model. Each rank's list of (kind, name, dtype, shape)
// is hashed and compared; on a mismatch every rank reports the first entry that differs from
// rank 0's list.
#include <algorithm>
#include <cstdint>
#include <string>
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

inline std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

template <communicator C, device D>
void check_same_model(C& comm, D& dev, const std::vector<signature_entry>& entries) {
  std::string text;
  for (const auto& e : entries) text += e.serialize();
  const auto hash = static_cast<std::int64_t>(fnv1a(text));
  auto hashes = host_all_gather(comm, dev, std::span<const std::int64_t>(&hash, 1));
  if (std::all_of(hashes.begin(), hashes.end(), [&](auto h) { return h == hashes[0]; })) return;

  std::int64_t length = static_cast<std::int64_t>(text.size());
  host_broadcast(comm, dev, std::span<std::int64_t>(&length, 1), 0);
  std::vector<std::uint8_t> reference(static_cast<std::size_t>(length));
  if (comm.rank() == 0) std::copy(text.begin(), text.end(), reference.begin());
  host_broadcast(comm, dev, std::span<std::uint8_t>(reference), 0);

  std::vector<std::string> theirs;
  std::string line;
  for (auto c : reference) {
    if (c == '\n') theirs.push_back(std::exchange(line, {}));
    else line += static_cast<char>(c);
  }
  std::optional<std::string> problem;
  for (std::size_t i = 0; i < std::max(entries.size(), theirs.size()) && !problem; ++i) {
    const std::string mine = i < entries.size() ? entries[i].describe() : "nothing";
    const std::string ref = i < theirs.size() ? theirs[i] : "nothing";
    if (mine != ref)
      problem = "entry " + std::to_string(i) + " is " + mine + ", but on rank 0 it is " + ref;
  }
  agree_or_throw(comm, dev, problem, "construct",
                 "ranks hold different models (pitfall P5): build the same module, with the same "
                 "parameter and buffer names, dtypes and shapes, on every rank");
}

}  // namespace ddp::detail
