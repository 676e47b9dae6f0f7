#pragma once
// Turns the sampler's indices for one epoch into batches. Every rank gets the same number of
// full batches (the sampler gives every rank the same number of indices; a last partial batch is
// dropped), so every rank takes the same number of steps.
//
//   ddp::data::loader loader(dataset, 64, collate);   // collate(std::span<const example>) -> batch
//   for (auto& batch : trainer.epoch(loader)) trainer.step(...);
//
// The loader has no shuffle of its own: with a distributed sampler the order comes from the
// sampler, seeded per epoch by the trainer (pitfall P4). A loader that does shuffle sets
// `shuffles_itself`, and the trainer rejects it at compile time next to a distributed sampler.
#include <cstddef>
#include <range/v3/range/conversion.hpp>
#include <range/v3/view/chunk.hpp>
#include <range/v3/view/transform.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/data/dataset.hpp"

namespace ddp::data {

template <dataset Dataset, class Collate>
class loader {
 public:
  static constexpr bool shuffles_itself = false;
  using example_type = typename Dataset::example_type;
  using batch_type = std::invoke_result_t<const Collate&, std::span<const example_type>>;

  loader(const Dataset& data, std::size_t batch_size, Collate collate)
      : data_(&data), batch_size_(batch_size), collate_(std::move(collate)) {
    if (batch_size == 0) throw std::invalid_argument("ddp::data::loader: batch size must be at least 1");
  }

  std::size_t dataset_size() const { return data_->size(); }
  std::size_t batch_size() const noexcept { return batch_size_; }

  // The batches of one epoch, from this rank's indices in the order the sampler gave them.
  std::vector<batch_type> batches(const std::vector<std::size_t>& indices) const {
    const std::size_t full = indices.size() / batch_size_ * batch_size_;
    return std::span(indices).first(full) | ranges::views::chunk(batch_size_) |
           ranges::views::transform([&](auto chunk) {
             std::vector<example_type> examples;
             examples.reserve(batch_size_);
             for (std::size_t i : chunk) examples.push_back(data_->get(i));
             return collate_(std::span<const example_type>(examples));
           }) |
           ranges::to<std::vector>();
  }

 private:
  const Dataset* data_;
  std::size_t batch_size_;
  Collate collate_;
};

}  // namespace ddp::data
