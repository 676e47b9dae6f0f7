#pragma once
// A bucket's layout: where the bucket policy's plan puts each parameter, how the update policy
// cuts the bucket into shards, and the layout's row in a checkpoint. The plan and the layout are
// checked here: a plan that leaves a parameter out, puts two in one place or runs past its
// bucket, and a layout that does not cut the bucket as its all_gather will, are errors naming
// the parameter or the bucket and the policy.
#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/core/dtype.hpp"
#include "ddp/policy/bucket_cap.hpp"
#include "ddp/policy/update.hpp"
#include "ddp/trainer/checkpoint_file.hpp"
#include "ddp/trainer/parameter_table.hpp"
#include "ddp/trainer/parts.hpp"

namespace ddp::detail {

// A 16-bit tensor's place in a bucket of floats (a bf16 or f16 parameter's gradient).
struct half_segment {
  void* tensor = nullptr;
  dtype type = dtype::bf16;
  std::size_t offset = 0;
  std::size_t count = 0;
};

// What of its own memory the module keeps in the trainer's buckets.
struct module_binding {
  bool values = false;     // its parameters, in the gathered copy (`values`)
  bool gradients = false;  // its gradients (`grads`)
};

// What a bucket is made from: the plan's size for it, the update policy's layout and memory plan.
struct bucket_shape {
  std::size_t index = 0;
  std::size_t numel = 0;
  update::layout layout;
  std::size_t control = 0;     // control floats after the padding (the last bucket's)
  update::memory_plan memory;  // which of `values` and `grads` the bucket keeps, and when
  module_binding bound;
  std::size_t virtual_shards = 0;  // reduction::invariant<V>: the exact sum over V micro-batches

  // The module's gradients live in `grads`: bound there, or placed layer by layer while the
  // bucket holds its full gradients (only the shard is kept between).
  bool gradients_in_bucket() const noexcept { return bound.gradients || memory.shards_gradients(); }
};

// A bucket's row in a checkpoint's layout: numel, padded, shard begin, shard.
using saved_bucket = std::array<std::size_t, 4>;
inline std::vector<saved_bucket> saved_bucket_layout(const checkpoint_file& f) { return number_rows<4>(f.text("buckets")); }

// Why the bucket policy's plan cannot place the parameters of `params`, or nothing.
inline std::optional<std::string> plan_problem(const bucket_plan& plan, const parameter_table& params) {
  const std::string policy = "the bucket_cap policy's plan";
  if (plan.buckets.empty() || plan.sizes.size() != plan.buckets.size())
    return (policy + " has " + std::to_string(plan.buckets.size()) + " bucket(s) and " + std::to_string(plan.sizes.size()) +
         " size(s); give every bucket a size, and at least one bucket");
  if (plan.slots.size() != params.size())
    return (policy + " places " + std::to_string(plan.slots.size()) + " parameter(s), but the module has " +
         std::to_string(params.size()) + "; give bucket_plan::slots one entry per parameter");
  std::vector<std::size_t> listed(params.size(), 0);
  for (std::size_t b = 0; b < plan.buckets.size(); ++b)
    for (const auto i : plan.buckets[b]) {
      if (i >= params.size())
        return (policy + " lists parameter index " + std::to_string(i) + " in bucket " + std::to_string(b) +
             ", but the module has " + std::to_string(params.size()) + " parameters; list indices below " +
             std::to_string(params.size()));
      if (plan.slots[i].bucket != b)
        return (policy + " lists parameter '" + params.name(i) + "' in bucket " + std::to_string(b) +
             " but places it in bucket " + std::to_string(plan.slots[i].bucket) + "; list it where its slot is");
      ++listed[i];
    }
  std::vector<std::vector<std::size_t>> by_bucket(plan.buckets.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& s = plan.slots[i];
    if (listed[i] != 1)
      return (policy + " lists parameter '" + params.name(i) + "' " + std::to_string(listed[i]) +
           " times; list every parameter in exactly one bucket");
    if (s.offset + params[i].numel > plan.sizes[s.bucket])
      return (policy + " places parameter '" + params.name(i) + "' (" + std::to_string(params[i].numel) +
           " elements) at offset " + std::to_string(s.offset) + " of bucket " + std::to_string(s.bucket) + ", which has " +
           std::to_string(plan.sizes[s.bucket]) + " elements; it must end inside its bucket");
    if (params[i].numel) by_bucket[s.bucket].push_back(i);  // an empty parameter may share its place
  }
  for (auto& members : by_bucket) {
    std::sort(members.begin(), members.end(),
              [&](auto a, auto b) { return plan.slots[a].offset < plan.slots[b].offset; });
    for (std::size_t k = 1; k < members.size(); ++k) {
      const auto a = members[k - 1], b = members[k];
      if (plan.slots[a].offset + params[a].numel > plan.slots[b].offset)
        return (policy + " gives parameters '" + params.name(a) + "' and '" + params.name(b) +
             "' overlapping places in bucket " + std::to_string(plan.slots[a].bucket) + " (offsets " +
             std::to_string(plan.slots[a].offset) + " and " + std::to_string(plan.slots[b].offset) +
             "); give each parameter a slot of its own");
    }
  }
  return std::nullopt;
}

// Every rank's part must be where the all_gather of the parameters puts it: equal blocks, rank
// r's at r x shard. A layout that does not gather must at least stay inside the bucket.
inline std::optional<std::string> layout_problem(const bucket_shape& s, std::string_view update, int rank, int ranks) {
  const auto& l = s.layout;
  const std::string where = "the update policy '" + std::string(update) + "' lays out bucket " +
                            std::to_string(s.index) + " (" + std::to_string(s.numel) + " elements) as shard " +
                            std::to_string(l.shard) + " from " + std::to_string(l.begin) + " of " +
                            std::to_string(l.padded) + ": ";
  if (l.padded < s.numel) return (where + "`padded` must hold the bucket's elements");
  if (l.begin + l.shard > l.padded) return (where + "this rank's shard runs past `padded`");
  if (s.memory.gathers_parameters() && (l.padded != l.shard * static_cast<std::size_t>(ranks) ||
                    l.begin != static_cast<std::size_t>(rank) * l.shard))
    return (where + "a policy that gathers parameters must cut each bucket into equal shards, one per rank, rank r's "
         "starting at r x shard, with padded = shard x ranks (where all_gather puts them)");
  return std::nullopt;
}

// Why a sharded layout cannot run at this world size or over this module, or nothing.
inline std::optional<std::string> world_problem(const bucket_shape& s, std::string_view update, int ranks,
                                                std::size_t half_floats) {
  const auto world = static_cast<std::size_t>(ranks);
  if (s.virtual_shards && world > s.virtual_shards)
    return "a world of " + std::to_string(ranks) + " ranks cannot hold " + std::to_string(s.virtual_shards) +
           " virtual shards, one at least per rank: run at most " + std::to_string(s.virtual_shards) +
           " ranks, or choose more shards (reduction::invariant<V>)";
  if (s.memory.shards_parameters() && !s.bound.values)
    return "update::" + std::string(update) + " keeps only this rank's shard of the parameters, so "
           "the module's values must live in the trainer's memory, which holds f32 parameters only; this "
           "module has " + std::to_string(half_floats) + " 16-bit parameter value(s): keep the "
           "parameters in f32, or use update::sharded_gradients";
  if (s.memory.shards_parameters() && s.virtual_shards % world != 0)
    return "update::" + std::string(update) + " gathers the parameters in every micro-batch's forward "
           "and backward, so every rank must run as many micro-batches per step; under reduction::invariant<" +
           std::to_string(s.virtual_shards) + "> the " + std::to_string(ranks) + " ranks would run " +
           "uneven shares of the virtual shards: run on a world size that divides " +
           std::to_string(s.virtual_shards) + ", or use update::sharded_gradients";
  return std::nullopt;
}

// What the trainer keeps in bucket memory, beside the update policy's layout.
struct bucket_memory {
  std::size_t control = 0;  // the last bucket's control floats
  module_binding bound;
  std::size_t virtual_shards = 0;
};

// The shape of every bucket of `plan` (into `shapes`), or why the plan or the update policy's
// layout cannot be used.
inline std::optional<std::string> shape_buckets(const bucket_plan& plan, const parameter_table& params,
                                                const update_part& update, const bucket_memory& memory, int rank,
                                                int ranks, std::vector<bucket_shape>& shapes) {
  std::optional<std::string> problem = plan_problem(plan, params);
  for (std::size_t b = 0; !problem && b < plan.buckets.size(); ++b) {
    bucket_shape shape;
    shape.index = b;
    shape.numel = plan.sizes[b];
    shape.layout = update.plan(plan.sizes[b], rank, ranks);
    if (b + 1 == plan.buckets.size()) shape.control = memory.control;
    shape.memory = update.memory();
    shape.bound = memory.bound;
    shape.virtual_shards = memory.virtual_shards;
    problem = layout_problem(shape, update.name(), rank, ranks);
    if (!problem) problem = world_problem(shape, update.name(), ranks, params.half_floats());
    shapes.push_back(shape);
  }
  return problem;
}

}  // namespace ddp::detail
