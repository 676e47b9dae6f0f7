#pragma once
// Policies written the way a user writes them: outside the library, against the slot concepts
// alone. tests/trainer/user_policies_test.cpp runs each; docs/policies.md shows them, word for
// word, between the `// [doc: ...]` marks (tests/docs/snippets_test.cpp checks it). The #include
// lines inside the marks name the slot's header for the reader; here they are no-ops (#pragma once).
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <ddp/policy/bucket_cap.hpp>
#include <ddp/policy/buffer_sync.hpp>
#include <ddp/policy/comm_hook.hpp>
#include <ddp/policy/unused_params.hpp>
#include <ddp/policy/update.hpp>
#include <ddp/sampler/sampler.hpp>
#include "support/user_optimizer.hpp"

namespace user {

// [doc: policies.md]
#include <ddp/policy/buffer_sync.hpp>

// BufferSync: rank 0's buffers before the first forward of every k-th step.
struct every_k_steps {
  using slot = ddp::buffer_sync::slot;
  static constexpr std::string_view name = "every_k_steps";
  std::uint64_t k = 4;
  int syncs = 0;
  void before_forward(ddp::buffer_sync::context& c) {
    if (c.forward_index() == 0 && c.step() % k == 0) synchronize(c);
  }
  void synchronize(ddp::buffer_sync::context& c) {
    c.broadcast_buffers(0);
    ++syncs;
  }
};
// [end doc]

// [doc: policies.md]
#include <ddp/policy/unused_params.hpp>

// UnusedParamDetection: detect_each_step's rule, and a log of what no rank used.
struct log_unused : ddp::unused_params::detect_each_step {
  static constexpr std::string_view name = "log_unused";
  std::vector<std::string> log;
  void after_reduction(ddp::unused_params::step_view& v, std::span<const float> averaged, std::span<char> update) {
    detect_each_step::after_reduction(v, averaged, update);
    for (std::size_t i = 0; i < update.size(); ++i)
      if (!update[i]) log.push_back(v.parameter_name(i));
  }
};
// [end doc]

// [doc: policies.md]
#include <ddp/policy/bucket_cap.hpp>

// Buckets: a small first bucket, so the first reduction starts early in backward (PyTorch does
// this with 1 MiB), then the usual cap.
template <std::size_t First, std::size_t Rest>
struct small_first_bucket {
  using slot = ddp::buckets::slot;
  static constexpr std::string_view name = "small_first_bucket";
  // Which parameters go in which bucket, and where: plan_buckets fills buckets in reverse
  // parameter order, a new one when the next parameter would pass the cap (here per bucket).
  ddp::bucket_plan plan(std::span<const std::size_t> numels) const {
    return ddp::plan_buckets(numels, [](std::size_t bucket) { return bucket == 0 ? First : Rest; });
  }
  // How describe() and checkpoints name the plan.
  std::string describe() const { return std::to_string(First) + " B, then " + std::to_string(Rest) + " B"; }
};
// [end doc]

// [doc: policies.md]
#include <ddp/policy/update.hpp>

// Update: sharded, each shard starting on a 4 KiB page instead of a cache line.
struct page_sharded {
  using slot = ddp::update::slot;
  static constexpr std::string_view name = "page_sharded";
  // Every rank keeps every parameter, in a gathered copy per bucket, and every gradient: it
  // reduce_scatters the gradients, updates its shard, and the ranks all_gather the shards.
  static constexpr ddp::update::memory_plan memory{.parameters = ddp::update::parameters_kept::gathered};
  // This rank's part of a bucket of `numel` floats: equal shards, rank r's at r * shard, and
  // padded = shard * ranks, as the all_gather lays them out (the trainer checks it).
  ddp::update::layout plan(std::size_t numel, int rank, int ranks) const {
    constexpr std::size_t page = 1024;  // floats
    const auto n = static_cast<std::size_t>(ranks);
    const std::size_t shard = (numel + n * page - 1) / (n * page) * page;
    return {shard, static_cast<std::size_t>(rank) * shard, shard * n};
  }
};
// [end doc]

// Sampler: rank r takes the r-th block of the data, newest last-first (no shuffle, drops the tail).
struct reversed_blocks {
  using slot = ddp::sampler::slot;
  static constexpr std::string_view name = "reversed_blocks";
  static constexpr bool is_distributed = false;
  static std::size_t per_rank(std::size_t n, int world) { return n / static_cast<std::size_t>(world); }
  static std::vector<std::size_t> indices(std::size_t n, int rank, int world, std::uint64_t, std::uint64_t) {
    const std::size_t m = per_rank(n, world);
    std::vector<std::size_t> out;
    for (std::size_t k = 0; k < m; ++k) out.push_back(n - 1 - (static_cast<std::size_t>(rank) * m + k));
    return out;
  }
};

// [doc: policies.md]
#include <ddp/sampler/sampler.hpp>

// Sampler: every k-th sample, dealt round-robin; k is the sampler's own state, set through
// trainer.policy<ddp::sampler::slot>().k.
struct every_kth {
  using slot = ddp::sampler::slot;
  static constexpr std::string_view name = "every_kth";
  static constexpr bool is_distributed = false;  // no per-epoch order: a loader may shuffle
  std::size_t k = 1;
  // How many indices each rank gets: the same on every rank.
  std::size_t per_rank(std::size_t n, int world) const { return n / k / static_cast<std::size_t>(world); }
  // This rank's indices in an epoch (seed and epoch would seed a shuffle).
  std::vector<std::size_t> indices(std::size_t n, int rank, int world, std::uint64_t, std::uint64_t) const {
    std::vector<std::size_t> out;
    for (std::size_t j = 0; j < per_rank(n, world); ++j)
      out.push_back((static_cast<std::size_t>(rank) + static_cast<std::size_t>(world) * j) * k);
    return out;
  }
};
// [end doc]

// [doc: policies.md]
#include <ddp/policy/comm_hook.hpp>

// CommHook: gradients averaged in f64, which ddp does not ship. The loops run on the host, so
// this hook is for ddp::host::device, whose memory they may read.
struct average_in_f64 {
  using slot = ddp::comm_hook::slot;
  static constexpr std::string_view name = "average_in_f64";
  int finished = 0;
  void reduce(ddp::comm_hook::bucket_io& b) {
    auto* wide = static_cast<double*>(b.scratch(0, b.size() * sizeof(double)));
    const float* g = b.gradients();
    for (std::size_t i = 0; i < b.size(); ++i) wide[i] = g[i];
    b.reduce_like_gradients({wide, b.size(), ddp::dtype::f64}, ddp::reduce_op::avg);
  }
  void finish(ddp::comm_hook::bucket_io& b) {
    b.wait();
    const auto* wide = static_cast<const double*>(b.scratch(0, b.size() * sizeof(double)));
    float* g = b.gradients();
    for (std::size_t i = b.shard_begin(); i < b.shard_begin() + b.shard(); ++i) g[i] = static_cast<float>(wide[i]);
    ++finished;
  }
};
// [end doc]

// [doc: policies.md]
#include <ddp/policy/reduction.hpp>

// Reduction: the exact sum over four virtual shards a step, under the run's own name.
struct four_shards {
  using slot = ddp::reduction::slot;
  static constexpr std::string_view name = "four_shards";
  static constexpr std::size_t virtual_shards = 4;
};
// [end doc]

}  // namespace user
