#pragma once
// Turns one rank's share of an epoch (a ddp::shard) into batches, made one at a time as the
// epoch's loop reaches them (on the rank's thread, or with ddp::data::prefetch{depth} on a
// thread of its own at most `depth` batches ahead). Every rank gets the same number of batches:
// the samplers give every rank the same number of indices. A last partial batch is kept when
// the sampler visits every sample (distributed<..., tail::pad>), dropped otherwise.
//
//   ddp::data::loader loader(dataset, 64, collate);   // collate(std::span<const example>) -> batch
//   for (auto& batch : trainer.epoch(loader)) trainer.step(...);
//
// Each batch is the collated batch plus `weights` (ddp::sample_weights): 0 for the samples a
// padding sampler repeats, 1 for the others. A loss given them counts every sample once
// (ddp::nn::softmax_cross_entropy(logits, labels, batch.weights)).
//
// The loader has no shuffle of its own: with a distributed sampler the order comes from the
// sampler, seeded per epoch by the trainer (pitfall P4). A loader that does shuffle sets
// `shuffles_itself`, and the trainer rejects it at compile time next to a distributed sampler.
#include <algorithm>
#include <memory>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "ddp/core/sample_weights.hpp"
#include "ddp/core/shard.hpp"
#include "ddp/data/batch_stream.hpp"
#include "ddp/data/dataset.hpp"

namespace ddp::data {

// A collated batch and the weights of its samples.
template <class Batch>
struct weighted_batch : Batch {
  static_assert(std::is_class_v<Batch>, "ddp: a loader's collate must return a class type (a struct of tensors, "
                                        "a std::vector, ...); weighted_batch derives from it");
  weighted_batch(Batch b, sample_weights w) : Batch(std::move(b)), weights(std::move(w)) {}
  sample_weights weights;
};

template <dataset Dataset, class Collate>
class loader {
 public:
  static constexpr bool shuffles_itself = false;
  using example_type = typename Dataset::example_type;
  using collated_type = std::invoke_result_t<const Collate&, std::span<const example_type>>;
  using batch_type = weighted_batch<collated_type>;

  loader(const Dataset& data, std::size_t batch_size, Collate collate, prefetch ahead = {})
      : data_(&data), batch_size_(batch_size), collate_(std::move(collate)), ahead_(ahead) {
    if (batch_size == 0) throw std::invalid_argument("ddp::data::loader: batch size must be at least 1");
  }
  // The loader and its batches keep a pointer to the data set: give it one that outlives them
  // (a named variable), not a temporary.
  loader(const Dataset&& temporary, std::size_t batch_size, Collate collate, prefetch ahead = {}) = delete;

  std::size_t dataset_size() const { return data_->size(); }
  std::size_t batch_size() const noexcept { return batch_size_; }
  std::size_t prefetch_depth() const noexcept { return ahead_.depth; }

  // This rank's batches of one epoch, in the sampler's order, made as the loop reaches them
  // (ddp/data/batch_stream.hpp). The stream keeps the shard, the collate function and a pointer
  // to the data set: the data set must outlive it, the loader need not.
  batch_stream<batch_type> batches(ddp::shard shard) const {
    const std::size_t n = shard.indices.size();
    const std::size_t used = shard.keep_partial_batch ? n : n / batch_size_ * batch_size_;
    const std::size_t count = (used + batch_size_ - 1) / batch_size_;
    auto make = [data = data_, size = batch_size_, collate = collate_, used,
                 s = std::make_shared<const ddp::shard>(std::move(shard))](std::size_t batch) {
      const std::size_t begin = batch * size, end = std::min(used, begin + size);
      std::vector<example_type> examples;
      examples.reserve(end - begin);
      for (std::size_t i = begin; i < end; ++i) examples.push_back(data->get(s->indices[i]));
      return batch_type(collate(std::span<const example_type>(examples)), weights(*s, begin, end));
    };
    return batch_stream<batch_type>(count, std::move(make), ahead_);
  }
  // Indices that are all samples, on one rank (outside a trainer): full batches only.
  batch_stream<batch_type> batches(std::vector<std::size_t> indices) const {
    return batches(ddp::shard::of_indices(std::move(indices)));
  }

 private:
  // Every rank's batch of this step covers the same positions [begin, end) of its own list.
  static sample_weights weights(const ddp::shard& shard, std::size_t begin, std::size_t end) {
    sample_weights w{std::vector<float>(end - begin, 0.0f), 0.0, shard.world()};
    const std::size_t real = shard.real_count();
    for (std::size_t i = begin; i < std::min(end, real); ++i) w.per_sample[i - begin] = 1.0f;
    for (std::size_t r : shard.real_counts) w.step_total += static_cast<double>(std::min(end, std::max(begin, r)) - begin);
    return w;
  }

  const Dataset* data_;
  std::size_t batch_size_;
  Collate collate_;
  prefetch ahead_;
};

}  // namespace ddp::data
