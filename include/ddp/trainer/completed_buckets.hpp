#pragma once
// The buckets as the update stage takes them: in bucket order, each one's reduction completed
// before the stage reads it. Going to the next bucket completes it (and any before it still in
// flight); all() completes every one first. The reduction behind them is a bucket_completion
// (the gradient reducer), which the stage never sees: the route goes one way, from the
// reductions to the update.
#include <cstddef>
#include <iterator>
#include <span>

namespace ddp::detail {

// What completes the buckets' reductions, in bucket order.
class bucket_completion {
 public:
  // Waits for the reductions of buckets up to `b` (those not yet complete, in bucket order).
  virtual void complete_through(std::size_t b) = 0;
  // After an update that overlapped the reductions, before the step counts: on a stream backend
  // the host learns whether a collective it has not read back since failed.
  virtual void confirm_collectives() = 0;

 protected:
  ~bucket_completion() = default;
};

template <class Bucket>
class completed_buckets {
 public:
  // `overlapped`: the reductions may still be in flight (the update overlaps them).
  completed_buckets(std::span<Bucket> buckets, bucket_completion& completion, bool overlapped) noexcept
      : buckets_(buckets), completion_(&completion), overlapped_(overlapped) {}

  class iterator {
   public:
    using value_type = Bucket;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    iterator(const completed_buckets* owner, std::size_t index) noexcept : owner_(owner), index_(index) {}
    // The bucket, its reduction completed.
    Bucket& operator*() const {
      owner_->completion_->complete_through(index_);
      return owner_->buckets_[index_];
    }
    iterator& operator++() noexcept {
      ++index_;
      return *this;
    }
    iterator operator++(int) noexcept {
      auto was = *this;
      ++index_;
      return was;
    }
    bool operator==(const iterator& other) const noexcept { return index_ == other.index_; }
    // Which bucket this is (its index in the buckets, and in their state).
    std::size_t index() const noexcept { return index_; }

   private:
    const completed_buckets* owner_ = nullptr;
    std::size_t index_ = 0;
  };

  iterator begin() const noexcept { return {this, 0}; }
  iterator end() const noexcept { return {this, buckets_.size()}; }
  std::size_t size() const noexcept { return buckets_.size(); }
  // The reductions may still be in flight when the stage begins.
  bool overlapped() const noexcept { return overlapped_; }
  // Every bucket, every reduction completed.
  std::span<Bucket> all() const {
    if (!buckets_.empty()) completion_->complete_through(buckets_.size() - 1);
    return buckets_;
  }
  // After the update of overlapped reductions (bucket_completion::confirm_collectives).
  void confirm_collectives() const { completion_->confirm_collectives(); }

 private:
  std::span<Bucket> buckets_;
  bucket_completion* completion_;
  bool overlapped_;
};

}  // namespace ddp::detail
