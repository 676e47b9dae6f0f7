#pragma once
// Turning a problem that one rank found into the same error on every rank, so no rank goes on
// into a collective its peers will never join.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "ddp/comm/host_collectives.hpp"
#include "ddp/core/error.hpp"

namespace ddp::detail {

// A caught exception as a problem for agree_or_throw: a ddp::error's text without its
// "ddp[backend] operation on rank r:" prefix (the rank is named where the problems are listed).
inline std::string problem_text(const std::exception& e) {
  if (const auto* d = dynamic_cast<const error*>(&e)) return d->detail();
  return e.what();
}

// Collective: every rank calls it. Returns when no rank has a problem; otherwise throws on
// every rank one ddp::error that lists each rank's problem (identical ones grouped). Its first
// line is what is wrong: the first problem, after the ranks that found it unless every rank did;
// the other ranks' problems follow, and `context` (what the operation could not do, or the fix
// that every problem shares) ends it.
template <communicator C, device D>
void agree_or_throw(C& comm, D& dev, const std::optional<std::string>& problem,
                    const std::string& operation, const std::string& context) {
  // Row layout: the text, then at least one zero byte, then a flag byte (1 = has a problem).
  std::int64_t length = problem ? static_cast<std::int64_t>(problem->size()) + 2 : 0;
  std::int64_t longest = length;
  comm::host_all_reduce(comm, dev, std::span<std::int64_t>(&longest, 1), reduce_op::max);
  if (longest == 0) return;

  std::vector<std::uint8_t> mine(static_cast<std::size_t>(longest), 0);
  if (problem) std::copy(problem->begin(), problem->end(), mine.begin());
  mine.back() = problem ? 1 : 0;  // marks "has a problem" (an empty text is still a problem)
  auto all = comm::host_all_gather(comm, dev, std::span<const std::uint8_t>(mine));

  struct group {
    std::string text, ranks;
    int count = 0;
  };
  std::vector<group> grouped;
  for (int r = 0; r < comm.size(); ++r) {
    const auto* row = all.data() + static_cast<std::size_t>(r) * mine.size();
    if (!row[mine.size() - 1]) continue;
    const auto* text_begin = reinterpret_cast<const char*>(row);
    std::string text(text_begin, std::find(text_begin, text_begin + mine.size() - 1, '\0'));
    auto it = std::find_if(grouped.begin(), grouped.end(), [&](auto& g) { return g.text == text; });
    if (it == grouped.end()) {
      grouped.push_back({text, "rank " + std::to_string(r), 1});
    } else {
      it->ranks = (it->count == 1 ? "ranks " + it->ranks.substr(5) : it->ranks) + ", " + std::to_string(r);
      ++it->count;
    }
  }
  std::string message;
  for (std::size_t g = 0; g < grouped.size(); ++g) {
    const auto& [text, ranks, count] = grouped[g];
    message += (g ? "\n  " : "") + (count == comm.size() ? std::string() : ranks + ": ") + text;
  }
  message += "\n  " + context;
  throw collective_error("trainer", operation, comm.rank(), message);
}

}  // namespace ddp::detail
