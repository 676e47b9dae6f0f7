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
#include <ranges>
#include <type_traits>
#include <utility>

#include "ddp/concepts/loader.hpp"
#include "ddp/sampler/sampler.hpp"
#include "ddp/trainer/metrics.hpp"

namespace ddp::detail {

// Collective. `core` offers communicator(), synchronize_buffers() and reduce(metrics).
template <class Core, class Module, class Loader, class F>
auto evaluate(Core& core, Module& module, const Loader& loader, F&& per_batch) {
  static_assert(loader_requirements::has_shard_batches<Loader>,
                "ddp: evaluate() needs a loader with batches(const ddp::shard&), whose batches carry the "
                "padding's weights (ddp::data::loader has it)");
  const auto& comm = core.communicator();
  const auto shard = sampler::evaluation_shard(loader.dataset_size(), comm.rank(), comm.size());
  core.synchronize_buffers();
  constexpr bool has_modes = requires { module.eval(); module.train(true); };
  bool was_training = true;
  if constexpr (requires { { module.training() } -> std::convertible_to<bool>; }) was_training = module.training();
  if constexpr (has_modes) module.eval();
  using batch_reference = std::ranges::range_reference_t<decltype(loader.batches(shard))>;
  using result_type = std::remove_cvref_t<std::invoke_result_t<F&, batch_reference>>;
  result_type total{};
  try {
    for (const auto& b : loader.batches(shard)) add_metrics(total, per_batch(b));
  } catch (...) {
    if constexpr (has_modes) module.train(was_training);
    throw;
  }
  if constexpr (has_modes) module.train(was_training);
  return core.reduce(total);
}

}  // namespace ddp::detail
