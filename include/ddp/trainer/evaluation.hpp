#pragma once
// trainer.evaluate(loader, per_batch): a reduced evaluation over a whole data set (a test set),
// every sample counted once at any world size: each rank takes its share in order
// (sampler::evaluation_shard), the padding weighing nothing, and the metrics are summed over
// the ranks. per_batch(batch) returns a ddp::metric or a std::array of them (sums and counts,
// each sample weighted by batch.weights: ddp::nn::softmax_cross_entropy's loss_sum, correct and
// samples). The buffers are synchronised first, so every rank evaluates with the same running
// statistics, and a module with train()/eval() evaluates in evaluation mode (forward saves
// nothing for a backward; batch_norm uses its running statistics), its mode restored after.
#include <concepts>
#include <cstddef>
#include <ranges>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/comm/host_collectives.hpp"
#include "ddp/concepts/loader.hpp"
#include "ddp/core/reduce_op.hpp"
#include "ddp/sampler/sampler.hpp"
#include "ddp/sampler/virtual_shards.hpp"
#include "ddp/trainer/metrics.hpp"
#include "ddp/trainer/parameters_gathered.hpp"

namespace ddp::detail {

// One virtual shard's metrics (a ddp::metric or a std::array of them), seen as metrics in a row.
template <class Result>
struct shard_total {
  Result total{};
  bool empty = true;  // not this rank's shard
  metric* values() noexcept {
    if constexpr (std::is_same_v<Result, metric>) return &total;
    else return total.data();
  }
};

// Under reduction::invariant<V> (`shards` = V) the data set is dealt to V virtual ranks, each
// rank evaluates its virtual shards' batches (sampler::virtual_shards) and keeps each shard's
// metrics apart; the V shards' metrics then reach every rank (a sum where every other rank adds
// zeros: exact) and are added in shard order, so the result is the same bits at every world size.
template <class Core, class Total>
Total add_in_shard_order(Core& core, std::vector<Total> per_shard) {
  constexpr std::size_t n = sizeof(decltype(Total::total)) / sizeof(metric);
  const std::size_t shards = per_shard.size();
  std::vector<double> flat(2 * n * shards, 0.0);
  for (std::size_t s = 0; s < shards; ++s) {
    if (per_shard[s].empty) continue;  // another rank's
    const metric* m = per_shard[s].values();
    for (std::size_t i = 0; i < n; ++i) flat[2 * (s * n + i)] = m[i].sum, flat[2 * (s * n + i) + 1] = m[i].count;
  }
  comm::host_all_reduce(core.communicator(), core.device(), std::span<double>(flat), reduce_op::sum);
  Total total{};
  metric* t = total.values();
  for (std::size_t s = 0; s < shards; ++s)
    for (std::size_t i = 0; i < n; ++i) t[i].add(flat[2 * (s * n + i)], flat[2 * (s * n + i) + 1]);
  return total;
}

// Collective. `core` offers communicator(), synchronize_buffers() and reduce(metrics); `parameters`
// gather_all() and release_all() (the parameter residency: sharded parameters are
// gathered once for the whole evaluation, whatever number of batches each rank has).
template <class Core, class Module, class Loader, class F, class Parameters>
auto evaluate(Core& core, Module& module, const Loader& loader, F&& per_batch, std::size_t shards,
              Parameters& parameters) {
  static_assert(loader_requirements::has_shard_batches<Loader>,
                "ddp: evaluate() needs a loader with batches(const ddp::shard&), whose batches carry the "
                "padding's weights (ddp::data::loader has it)");
  const auto& comm = core.communicator();
  const auto shard = sampler::evaluation_shard(loader.dataset_size(), comm.rank(), comm.size());
  const auto mine = shards ? sampler::virtual_shards(shards, comm.rank(), comm.size()) : sampler::shard_range{};
  core.synchronize_buffers();
  const parameters_gathered whole(parameters);
  constexpr bool has_modes = requires { module.eval(); module.train(true); };
  bool was_training = true;
  if constexpr (requires { { module.training() } -> std::convertible_to<bool>; }) was_training = module.training();
  if constexpr (has_modes) module.eval();
  using batch_reference = std::ranges::range_reference_t<decltype(loader.batches(shard))>;
  using result_type = std::remove_cvref_t<std::invoke_result_t<F&, batch_reference>>;
  result_type total{};
  std::vector<shard_total<result_type>> per_shard(shards);
  try {
    if (shards == 0) {
      for (const auto& b : loader.batches(shard)) add_metrics(total, per_batch(b));
    } else {
      for (std::size_t s = mine.first; s < mine.last; ++s) {
        per_shard[s].empty = false;
        const auto virtual_shard = sampler::evaluation_shard(loader.dataset_size(), static_cast<int>(s),
                                                             static_cast<int>(shards));
        for (const auto& b : loader.batches(virtual_shard)) add_metrics(per_shard[s].total, per_batch(b));
      }
    }
  } catch (...) {
    if constexpr (has_modes) module.train(was_training);
    throw;
  }
  if constexpr (has_modes) module.train(was_training);
  if (shards == 0) return core.reduce(total);
  return add_in_shard_order(core, std::move(per_shard)).total;
}

}  // namespace ddp::detail
