#pragma once
// One bucket's exact sum over a step's micro-batches and ranks (reduction::invariant<V>): each
// micro-batch's gradients are set aside as it ends; at the step's last backward every block's
// largest magnitude is agreed over the ranks (all_reduce max: exact), each micro-batch is
// rounded once to integers at its block's scale and added (ddp::reduction::exact), the integers
// are reduced like the gradients (all_reduce or reduce_scatter, sum: exact in any order), and
// the reduced part becomes the average over the V micro-batches. Host arithmetic: on a device
// whose memory the host cannot read, the bucket is staged through host memory.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"
#include "ddp/core/error.hpp"
#include "ddp/policy/reduction.hpp"

namespace ddp::detail {

template <communicator Comm, device Device>
class exact_sum {
  static constexpr bool host_memory = Device::kind == device_kind::cpu;

 public:
  // `padded`: the bucket's gradient floats; `shards`: V.
  exact_sum(Comm& comm, Device& dev, std::size_t padded, std::size_t shards)
      : comm_(&comm), device_(&dev), padded_(padded), shards_(shards),
        max_(blocks(), 0.0f), agreed_max_(dev, blocks()), sums_(dev, padded) {}

  // Where the gradients of the micro-batch now ending go (padded floats, zero beyond the
  // parameters'), before the caller zeroes the module's.
  float* set_aside_next(std::size_t bucket) {
    if (set_aside_ + 1 >= shards_)
      throw error("trainer", "accumulate", comm_->rank(),
                  "under reduction::invariant<" + std::to_string(shards_) + "> a step is " + std::to_string(shards_) +
                      " micro-batches in all, and this rank has run more (bucket " + std::to_string(bucket) +
                      "); run each of the rank's virtual shards once (ddp::sampler::virtual_shards)");
    if (set_aside_ == 0) std::fill(max_.begin(), max_.end(), 0.0f);  // a new step's maxima
    if (kept_.size() == set_aside_) kept_.push_back(zeroed_array<float>(*device_, padded_));
    return kept_[set_aside_++].data();
  }
  // The micro-batch set_aside_next() gave storage for is there: on the host, its block maxima are
  // taken now, while it is fresh in cache.
  void set_aside_done() {
    if constexpr (host_memory) reduction::exact::block_max(readable(kept_[set_aside_ - 1].data()), max_);
  }

  // The sum of the set-aside micro-batches and `last` (this rank's last, in bucket layout), as
  // integers laid out as the gradients: reduce them like the gradients with reduce_op::sum.
  mutable_buffer start(const float* last) {
    if constexpr (host_memory) {  // the set-aside micro-batches' maxima are in already
      if (set_aside_ == 0) std::fill(max_.begin(), max_.end(), 0.0f);
      reduction::exact::block_max(readable(last), max_);
    } else {
      std::fill(max_.begin(), max_.end(), 0.0f);
      each_micro_batch(last, [&](std::span<const float> g) { reduction::exact::block_max(g, max_); });
    }
    device_->copy_from_host(agreed_max_.data(), max_.data(), max_.size() * sizeof(float));
    const mutable_buffer m{agreed_max_.data(), max_.size(), dtype::f32};
    auto agreed = comm_->all_reduce(m, m, reduce_op::max);
    agreed.wait();
    device_->copy_to_host(max_.data(), agreed_max_.data(), max_.size() * sizeof(float));
    rethrow_failure(agreed);  // a stream backend's failure, once the host has the values

    std::span<std::int64_t> sums(host_memory ? sums_.data() : staged(host_sums_).data(), padded_);
    if constexpr (host_memory) {
      std::vector<const float*> all;
      for (std::size_t k = 0; k < set_aside_; ++k) all.push_back(kept_[k].data());
      all.push_back(last);
      reduction::exact::sum_blocks(all, padded_, max_, sums);
    } else {
      std::fill(sums.begin(), sums.end(), std::int64_t{0});
      each_micro_batch(last, [&](std::span<const float> g) { reduction::exact::accumulate(g, max_, sums); });
      device_->copy_from_host(sums_.data(), sums.data(), padded_ * sizeof(std::int64_t));
    }
    set_aside_ = 0;
    return {sums_.data(), padded_, dtype::i64};
  }

  // The reduced integers [first, first + count) as the average over the V micro-batches, into
  // `gradients` (the bucket's, same layout).
  void finish(float* gradients, std::size_t first, std::size_t count) {
    std::span<const std::int64_t> sums;
    if constexpr (host_memory) {
      sums = std::span<const std::int64_t>(sums_.data(), padded_);
    } else {
      auto& h = staged(host_sums_);
      device_->copy_to_host(h.data() + first, sums_.data() + first, count * sizeof(std::int64_t));
      sums = h;
    }
    std::span<float> out(host_memory ? gradients + first : staged(host_out_).data(), count);
    reduction::exact::to_average(sums, first, max_, shards_, out);
    if constexpr (!host_memory) device_->copy_from_host(gradients + first, out.data(), count * sizeof(float));
  }

 private:
  std::size_t blocks() const noexcept { return (padded_ + reduction::exact::block - 1) / reduction::exact::block; }

  template <class F>
  void each_micro_batch(const float* last, F&& f) {
    for (std::size_t k = 0; k < set_aside_; ++k) f(readable(kept_[k].data()));
    f(readable(last));
  }
  // `p` (padded floats of device memory) where the host can read it.
  std::span<const float> readable(const float* p) {
    if constexpr (host_memory) {
      return {p, padded_};
    } else {
      auto& h = staged(host_in_);
      device_->copy_to_host(h.data(), p, padded_ * sizeof(float));
      return h;
    }
  }
  template <class T>
  std::vector<T>& staged(std::vector<T>& v) {
    v.resize(padded_);
    return v;
  }

  Comm* comm_;
  Device* device_;
  std::size_t padded_;
  std::size_t shards_;
  std::vector<device_array<Device, float>> kept_;  // the set-aside micro-batches, reused from step to step
  std::size_t set_aside_ = 0;                      // in this step
  std::vector<float> max_;                         // per block: this rank's, then every rank's
  device_array<Device, float> agreed_max_;
  device_array<Device, std::int64_t> sums_;
  std::vector<float> host_in_, host_out_;          // staging, on a device the host cannot read
  std::vector<std::int64_t> host_sums_;
};

}  // namespace ddp::detail
