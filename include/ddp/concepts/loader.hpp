#pragma once
// The loader concept: what trainer.epoch(loader) asks of a loader.
//
//   static constexpr bool shuffles_itself;   // true when it reorders data on its own (then it
//                                             // cannot sit beside a distributed sampler)
//   std::size_t dataset_size() const;         // the sampler draws indices in [0, dataset_size())
//   range batches(const ddp::shard& shard) const;
//        // this rank's batches for one epoch, from its indices in the sampler's order, knowing
//        // which are padding (ddp/core/shard.hpp); every rank must get the same number of
//        // batches (the samplers give every rank as many indices)
//   or, for a loader that needs no padding marks, range batches(const std::vector<std::size_t>&) const
//
// ddp::data::loader (include/ddp/data/loader.hpp) models it. A user's loader that misses a
// member fails at trainer.epoch with one ddp: message naming it.
#include <concepts>
#include <cstddef>
#include <ranges>
#include <vector>

#include "ddp/core/shard.hpp"

namespace ddp {

namespace loader_requirements {
template <class L>
concept has_shuffles_itself = requires {
  { L::shuffles_itself } -> std::convertible_to<bool>;
};
template <class L>
concept has_dataset_size = requires(const L& l) {
  { l.dataset_size() } -> std::convertible_to<std::size_t>;
};
template <class L>
concept has_shard_batches = requires(const L& l, const shard& s) {
  { l.batches(s) } -> std::ranges::input_range;
};
template <class L>
concept has_index_batches = requires(const L& l, const std::vector<std::size_t>& indices) {
  { l.batches(indices) } -> std::ranges::input_range;
};
template <class L>
concept has_batches = has_shard_batches<L> || has_index_batches<L>;
}  // namespace loader_requirements

template <class L>
concept epoch_loader = loader_requirements::has_shuffles_itself<L> && loader_requirements::has_dataset_size<L> &&
                       loader_requirements::has_batches<L>;

template <class L>
consteval bool diagnose_loader() {
  namespace r = loader_requirements;
  static_assert(r::has_shuffles_itself<L>,
                "ddp: the loader lacks `static constexpr bool shuffles_itself` (false unless it reorders "
                "data on its own; see ddp/concepts/loader.hpp)");
  static_assert(r::has_dataset_size<L>, "ddp: the loader lacks `std::size_t dataset_size() const`");
  static_assert(r::has_batches<L>,
                "ddp: the loader lacks `batches(const ddp::shard& shard) const` (or `batches(const "
                "std::vector<std::size_t>& indices) const`) returning a range of batches");
  return epoch_loader<L>;
}

}  // namespace ddp
