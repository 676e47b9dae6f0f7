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

// Collective: every rank calls it. Returns when no rank has a problem; otherwise throws on
// every rank one ddp::error that lists each rank's problem (identical ones grouped).
template <communicator C, device D>
void agree_or_throw(C& comm, D& dev, const std::optional<std::string>& problem,
                    const std::string& operation, const std::string& preface) {
  // Row layout: the text, then at least one zero byte, then a flag byte (1 = has a problem).
  std::int64_t length = problem ? static_cast<std::int64_t>(problem->size()) + 2 : 0;
  std::int64_t longest = length;
  comm::host_all_reduce(comm, dev, std::span<std::int64_t>(&longest, 1), reduce_op::max);
  if (longest == 0) return;

  std::vector<std::uint8_t> mine(static_cast<std::size_t>(longest), 0);
  if (problem) std::copy(problem->begin(), problem->end(), mine.begin());
  mine.back() = problem ? 1 : 0;  // marks "has a problem" (an empty text is still a problem)
  auto all = comm::host_all_gather(comm, dev, std::span<const std::uint8_t>(mine));

  std::vector<std::pair<std::string, std::string>> grouped;  // text, ranks
  for (int r = 0; r < comm.size(); ++r) {
    const auto* row = all.data() + static_cast<std::size_t>(r) * mine.size();
    if (!row[mine.size() - 1]) continue;
    const auto* text_begin = reinterpret_cast<const char*>(row);
    std::string text(text_begin, std::find(text_begin, text_begin + mine.size() - 1, '\0'));
    auto it = std::find_if(grouped.begin(), grouped.end(), [&](auto& g) { return g.first == text; });
    if (it == grouped.end()) grouped.emplace_back(text, "rank " + std::to_string(r));
    else it->second = (it->second.starts_with("rank ") ? "ranks " + it->second.substr(5) : it->second) +
                      ", " + std::to_string(r);
  }
  std::string message = preface;
  for (auto& [text, ranks] : grouped) message += "\n  " + ranks + ": " + text;
  throw collective_error("trainer", operation, comm.rank(), message);
}

}  // namespace ddp::detail
