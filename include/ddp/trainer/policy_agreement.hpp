#pragma once
// Every rank must run the same policies: they decide which collectives a step issues and what the
// ranks make of the results. Ranks whose policies differ (a trainer type picked by a flag that
// differs per rank, a one_of that selected differently per rank) would otherwise issue
// collectives that pair wrongly (a hang, or MPI's own crash), or the same collectives with another
// meaning: an unused_params::one_of that chose forbid on one rank and static_graph on another
// issues the same collectives (its control floats have room for either), and the ranks would
// train on, each with its own rule.
//
// The trainer agrees on its policies when it is built, and, where a slot chooses at run time (a
// one_of), again at its first step and at the first step after any select(). The ranks compare a
// hash of every slot's policy (one all_gather of 8 bytes per rank); when the hashes differ, every
// rank gathers every rank's policies and throws the same ddp::collective_error, naming each slot
// that differs, the policy each rank runs and the ranks on each side.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/core/compiled_runtime.hpp"
#include "ddp/core/error.hpp"
#include "ddp/trainer/signature.hpp"
#include "ddp/trainer/step_observer.hpp"

namespace ddp::detail {

// Each slot's name and the description of its policy as the trainer holds it ("" for a default
// that goes unnamed), in the trainer's slot order.
using slot_descriptions = std::vector<std::pair<std::string_view, std::string>>;

// A slot's holder whose policy chooses at run time (a one_of: ddp/policy/one_of.hpp).
template <class Holder>
concept holds_run_time_choice = requires(const Holder& h) { h.policy.selections(); };

// What the ranks compare: one "slot=policy" line per slot.
DDP_RUNTIME_INLINE std::string policies_text(const slot_descriptions& slots);

// The error's text for the ranks' policies_text (texts[r] is rank r's): its first line names the
// first slot that differs, the policy each side runs and its ranks; further slots that differ and
// the fix follow. Empty when every rank's text is the same.
DDP_RUNTIME_INLINE std::string policy_disagreement(const std::vector<std::string>& texts);

// Collective: returns when every rank's `text` (policies_text) is the same, and otherwise throws
// on every rank the same collective_error (policy_disagreement).
template <communicator C, device D>
void agree_on_policies(C& comm, D& dev, const std::string& text, const char* operation) {
  const comm::tag_scope tag(comm::purpose::policy_agreement);
  const auto hash = static_cast<std::int64_t>(fnv1a(text));
  const auto hashes = comm::host_all_gather(comm, dev, std::span<const std::int64_t>(&hash, 1));
  if (std::all_of(hashes.begin(), hashes.end(), [&](std::int64_t h) { return h == hashes[0]; })) return;
  // Every rank saw the same hashes, so every rank gathers the texts and throws alike.
  std::int64_t longest = static_cast<std::int64_t>(text.size());
  comm::host_all_reduce(comm, dev, std::span<std::int64_t>(&longest, 1), reduce_op::max);
  std::vector<std::uint8_t> mine(static_cast<std::size_t>(longest), 0);
  std::copy(text.begin(), text.end(), mine.begin());
  const auto all = comm::host_all_gather(comm, dev, std::span<const std::uint8_t>(mine));
  std::vector<std::string> texts;
  for (int r = 0; r < comm.size(); ++r) {
    const char* row = reinterpret_cast<const char*>(all.data()) + static_cast<std::size_t>(r) * mine.size();
    texts.emplace_back(row, std::find(row, row + mine.size(), '\0'));
  }
  throw collective_error("trainer", operation, comm.rank(), policy_disagreement(texts));
}

// The trainer's agreement: now (collective: at construction, on every rank), and when a slot can
// choose at run time, at the first step and at the first step after a select() on this rank.
// `holders` (trainer/trainer_policies.hpp) gives descriptions() and selections(), and must outlive
// `observer`.
template <communicator C, device D, class Holders>
void agree_on_policies(C& comm, D& dev, step_observer& observer, const Holders& holders) {
  agree_on_policies(comm, dev, policies_text(holders.descriptions()), "construct");
  if constexpr (Holders::chooses_at_run_time) {
    // Selections counted at the last agreement (none yet: the first step agrees whatever they are).
    observer.on_step_begin([&comm, &dev, &holders, agreed = ~std::uint64_t{0}](std::uint64_t, bool) mutable {
      const std::uint64_t now = holders.selections();
      if (now == agreed) [[likely]]
        return;
      agree_on_policies(comm, dev, policies_text(holders.descriptions()), "step");
      agreed = now;
    });
  }
}

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE std::string policies_text(const slot_descriptions& slots) {
  std::string text;
  for (const auto& [slot, name] : slots) text.append(slot).append("=").append(name).append("\n");
  return text;
}

DDP_RUNTIME_INLINE std::string policy_disagreement(const std::vector<std::string>& texts) {
  // Each rank's policy by slot, the slots in the order the ranks list them.
  std::vector<std::string> slots;
  std::vector<std::vector<std::pair<std::string, std::string>>> per_rank;
  for (const auto& text : texts) {
    auto& mine = per_rank.emplace_back();
    for (const auto& line : lines_of(text)) {
      const auto eq = line.find('=');
      std::string slot = line.substr(0, eq), name = eq == std::string::npos ? std::string() : line.substr(eq + 1);
      if (std::find(slots.begin(), slots.end(), slot) == slots.end()) slots.push_back(slot);
      mine.emplace_back(std::move(slot), std::move(name));
    }
  }
  auto policy_of = [&](std::size_t rank, const std::string& slot) -> std::string {
    for (const auto& [s, name] : per_rank[rank])
      if (s == slot) return name.empty() ? "its default (unnamed)" : "'" + name + "'";
    return "no such slot";
  };
  std::string message;
  for (const auto& slot : slots) {
    std::vector<std::pair<std::string, std::vector<std::size_t>>> sides;  // policy, its ranks
    for (std::size_t r = 0; r < per_rank.size(); ++r) {
      const std::string p = policy_of(r, slot);
      auto it = std::find_if(sides.begin(), sides.end(), [&](const auto& s) { return s.first == p; });
      if (it == sides.end()) sides.push_back({p, {r}});
      else it->second.push_back(r);
    }
    if (sides.size() < 2) continue;
    std::string line;
    for (const auto& [policy, ranks] : sides) {
      std::string who = ranks.size() == 1 ? "rank " : "ranks ";
      for (std::size_t k = 0; k < ranks.size(); ++k) who += (k ? ", " : "") + std::to_string(ranks[k]);
      line += (line.empty() ? "" : "; ") + who + (ranks.size() == 1 ? " runs " : " run ") + policy;
    }
    message += message.empty() ? "ranks run different policies in slot " + slot + ": " + line
                               : "\n  and in slot " + slot + ": " + line;
  }
  if (message.empty()) return message;
  return message +
         "\n  every rank must run the same policies, which decide the collectives of a step and what the ranks do "
         "with their results: build every rank's trainer with the same policy list, and select a one_of's policy "
         "alike on every rank, before the same step (from a setting every rank reads alike, or rank 0's choice "
         "broadcast to the others)";
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::detail
