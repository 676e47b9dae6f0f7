#pragma once
// The steps of an epoch dealt as virtual shards (trainer.epoch_shards() under
// reduction::invariant<V>): step t is this rank's shards' batch t, in shard order, one batch
// stream per shard. A single-pass range of steps; each step a small range of the batches.
//
//   for (const auto& step : trainer.epoch_shards(loader))   // this rank's shards of each step
//     trainer.step(step, [&](auto& replica, const auto& batch) { ... });   // a micro-batch each
#include <cstddef>
#include <iterator>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"

namespace ddp::data {

template <class Stream>
class shard_steps {
  using stream_iterator = decltype(std::declval<const Stream&>().begin());

 public:
  using batch_type = std::remove_cvref_t<decltype(*std::declval<stream_iterator>())>;

  // `streams`: one per shard this rank holds, in shard order, equally long.
  explicit shard_steps(std::vector<Stream> streams) : streams_(std::move(streams)) {
    if (streams_.empty()) throw error("data", "shard_steps", -1, "no shard streams: a rank holds one shard at least");
    steps_ = streams_.front().size();
    for (const auto& s : streams_)
      if (s.size() != steps_)
        throw error("data", "shard_steps", -1,
                    "the shards' batch streams differ in length (" + std::to_string(s.size()) + " and " +
                        std::to_string(steps_) + " batches): deal them with one sampler and loader");
  }

  // The steps of the epoch (after a resumed checkpoint's skip), and the shards of each.
  std::size_t size() const noexcept { return steps_; }
  std::size_t shards() const noexcept { return streams_.size(); }

  // One step: this rank's shards' batches, in shard order.
  class step {
   public:
    std::size_t size() const noexcept { return at_->size(); }
    const batch_type& operator[](std::size_t k) const { return *(*at_)[k]; }
    auto begin() const { return indirect(at_->begin()); }
    auto end() const { return indirect(at_->end()); }

   private:
    friend class shard_steps;
    explicit step(const std::vector<stream_iterator>* at) : at_(at) {}
    struct indirect {
      typename std::vector<stream_iterator>::const_iterator it;
      const batch_type& operator*() const { return **it; }
      indirect& operator++() {
        ++it;
        return *this;
      }
      bool operator==(const indirect&) const = default;
    };
    const std::vector<stream_iterator>* at_;
  };

  class iterator {
   public:
    using value_type = step;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    const step& operator*() const { return current_; }
    const step* operator->() const { return &current_; }
    iterator& operator++() {
      for (auto& it : owner_->at_) ++it;
      ++owner_->taken_;
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(std::default_sentinel_t) const { return owner_->taken_ == owner_->steps_; }

   private:
    friend class shard_steps;
    explicit iterator(shard_steps* owner) : owner_(owner), current_(&owner->at_) {}
    shard_steps* owner_ = nullptr;
    step current_{nullptr};
  };

  // Single pass, as the streams are.
  iterator begin() {
    if (started_)
      throw error("data", "shard_steps", -1, "an epoch's steps are a single pass and this one has begun");
    started_ = true;
    for (auto& s : streams_) at_.push_back(s.begin());
    return iterator(this);
  }
  std::default_sentinel_t end() const noexcept { return {}; }

  // The streams themselves, one per shard (before begin()).
  std::vector<Stream>& streams() noexcept { return streams_; }

 private:
  std::vector<Stream> streams_;
  std::vector<stream_iterator> at_;
  std::size_t steps_ = 0, taken_ = 0;
  bool started_ = false;
};

}  // namespace ddp::data
