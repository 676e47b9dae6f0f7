#pragma once
// Which checkpoints of a directory a save keeps (trainer.save(dir, save_options)): the last k
// saved, every one whose step count is a multiple of n, and the best k by a metric the program
// passes. A pure rule over the directory's index; the save applies it after the commit.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "ddp/trainer/checkpoint_file.hpp"

namespace ddp {

// trainer.save(dir, {.keep_last = 3, .metric = val_loss, .keep_best = 2}). Pass the same options
// on every rank, at every save: a save keeps what its own options ask for, and removes the rest.
struct save_options {
  std::size_t keep_last = 1;         // the k checkpoints saved last, this one among them (at least 1)
  std::uint64_t keep_every_steps = 0;  // also each one whose step count is a multiple of this (0: none)
  std::optional<double> metric{};    // this checkpoint's score (a validation loss, say), the same on every rank
  std::size_t keep_best = 0;         // also the k with the best metric; one saved without a metric never is
  bool lower_is_better = true;       // best = lowest metric (a loss); false: highest (an accuracy)
};

namespace detail {

// What is wrong with `o`, "" when nothing.
inline std::string save_options_problem(const save_options& o) {
  if (o.keep_last == 0)
    return "save_options::keep_last is 0, but the checkpoint just written is the one trainer.load(dir) finds: "
           "keep at least 1";
  if (o.metric && std::isnan(*o.metric))
    return "save_options::metric is NaN, which ranks neither above nor below another checkpoint: pass a number, "
           "or no metric";
  return "";
}

inline std::string describe(const save_options& o) {
  char metric[32] = "none";
  if (o.metric) std::snprintf(metric, sizeof metric, "%.17g", *o.metric);
  return "keep_last=" + std::to_string(o.keep_last) + ", keep_every_steps=" + std::to_string(o.keep_every_steps) +
         ", metric=" + metric + ", keep_best=" + std::to_string(o.keep_best) +
         ", lower_is_better=" + (o.lower_is_better ? "true" : "false");
}

// The checkpoints of `all` (oldest save first, the new one last) that a save with options `o`
// keeps, in the same order.
inline std::vector<checkpoint_info> retained(const std::vector<checkpoint_info>& all, const save_options& o) {
  std::vector<bool> keep(all.size(), false);
  for (std::size_t i = all.size() - std::min(all.size(), o.keep_last); i < all.size(); ++i) keep[i] = true;
  if (o.keep_every_steps)
    for (std::size_t i = 0; i < all.size(); ++i) keep[i] = keep[i] || all[i].steps % o.keep_every_steps == 0;
  std::vector<std::size_t> scored;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].metric) scored.push_back(i);
  // Ties: the earlier save ranks first.
  std::stable_sort(scored.begin(), scored.end(), [&](std::size_t a, std::size_t b) {
    return o.lower_is_better ? *all[a].metric < *all[b].metric : *all[a].metric > *all[b].metric;
  });
  for (std::size_t k = 0; k < std::min(o.keep_best, scored.size()); ++k) keep[scored[k]] = true;
  std::vector<checkpoint_info> kept;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (keep[i]) kept.push_back(all[i]);
  return kept;
}

}  // namespace detail
}  // namespace ddp
