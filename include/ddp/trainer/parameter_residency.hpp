#pragma once
// Where the parameters live under an update policy that keeps only this rank's shard of them
// (update::fully_sharded): a bucket holds its gathered parameters from the forward (or backward)
// of its first layer until every layer of it is through, in memory from the pool; the module's
// values are placed there meanwhile, and the bucket the pass needs next starts gathering while a
// layer computes. gather_all() (through parameters_gathered) holds them all, in memory of their own, for what reads the
// whole model between steps (an evaluation, a checkpoint). Under a policy that keeps the
// parameters whole nothing here acts, and gathering is a no-op.
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/trainer/module_placement.hpp"
#include "ddp/core/error.hpp"
#include "ddp/trainer/bucket.hpp"
#include "ddp/trainer/memory_pool.hpp"
#include "ddp/trainer/parameter_table.hpp"
#include "ddp/trainer/parts.hpp"

namespace ddp::detail {

template <communicator Comm, device Device>
class parameter_residency {
 public:
  using bucket_type = bucket<Comm, Device>;

  // `buckets`: the reducer's, every one built before the first call here. `place`: how the
  // module's value of parameter i is pointed at memory (nullptr: nowhere; empty: not placed).
  parameter_residency(Device& dev, parameter_table& params, std::vector<bucket_type>& buckets,
                      memory_pool<Device>& pool, const update_part& update, int rank,
                      std::function<void(std::size_t, float*)> place)
      : device_(dev), params_(params), buckets_(buckets), pool_(pool), update_(update), rank_(rank),
        place_(std::move(place)), forwarded_(params.size(), 0), backwarded_(params.size(), 0) {}
  // Holds references and state that others point into: neither copied nor moved.
  parameter_residency(const parameter_residency&) = delete;
  parameter_residency& operator=(const parameter_residency&) = delete;

  // Only this rank's shard of the parameters is kept; they are gathered layer by layer.
  bool active() const noexcept { return update_.memory().shards_parameters(); }

  // Parameters [first, first + count) are about to be read: their buckets' values gathered (and
  // waited for), and the bucket that the pass needs next starts gathering: that of the parameter
  // just past these buckets' own (after them in forward, before them in backward; a bucket's
  // parameters lie together).
  void need(std::size_t first, std::size_t count, bool forward) {
    const std::size_t last = std::min(first + count, params_.size());
    std::size_t lo = params_.size(), hi = 0;
    for (std::size_t i = first; i < last; ++i) {
      auto& bk = buckets_[params_[i].slot.bucket];
      if (!bk.values_held()) hold(bk, /*gather=*/true, /*pooled=*/true);
      for (const auto p : bk.parameters()) lo = std::min(lo, p), hi = std::max(hi, p);
    }
    const std::size_t next = forward ? hi + 1 : (lo == 0 ? params_.size() : lo - 1);
    if (first < last && next < params_.size())
      if (auto& bk = buckets_[params_[next].slot.bucket]; !bk.values_held())
        hold(bk, /*gather=*/true, /*pooled=*/true);
    for (std::size_t i = first; i < last; ++i) buckets_[params_[i].slot.bucket].wait_values();
  }
  // A layer's forward (or backward) is done with parameters [first, first + count): a bucket whose
  // every parameter is through gives its gathered memory back to the pool.
  void done(std::size_t first, std::size_t count, bool forward) {
    if (pinned_) return;
    auto& through = forward ? forwarded_ : backwarded_;
    const std::size_t last = std::min(first + count, params_.size());
    for (std::size_t i = first; i < last; ++i) through[i] = 1;
    for (std::size_t i = first; i < last; ++i) {
      auto& bk = buckets_[params_[i].slot.bucket];
      const auto members = bk.parameters();
      if (bk.values_held() && std::all_of(members.begin(), members.end(), [&](std::size_t p) { return through[p] != 0; }))
        release(bk, /*to_pool=*/true);
    }
  }

  // Every parameter gathered into the module and kept there (the layer hooks neither release nor
  // gather any) until the next micro-batch begins or release_all(). Collective. Returns whether it
  // gathered them (false: they were already, or the policy keeps them whole).
  bool gather_all() {
    if (!active() || pinned_) return false;
    for (auto& bk : buckets_)
      if (!bk.values_held()) hold(bk, /*gather=*/true, /*pooled=*/false);
    for (auto& bk : buckets_) bk.wait_values();
    pinned_ = true;
    return true;
  }
  // Gives back gather_all()'s memory; none of it is kept for the next step (it held the whole
  // model, in memory of its own: the pool the steps use is left as it was). Not collective.
  void release_all() {
    if (!pinned_) return;
    pinned_ = false;
    for (auto& bk : buckets_)
      if (bk.values_held()) release(bk, /*to_pool=*/false);
  }
  // Memory for every parameter, not gathered: a checkpoint's values are written there next, and
  // keep_shards() keeps this rank's shard of them.
  void hold_all() {
    if (!active()) return;
    for (auto& bk : buckets_)
      if (!bk.values_held()) hold(bk, /*gather=*/false, /*pooled=*/false);
    pinned_ = true;
  }
  // This rank's shard is kept from the values held, which go (the module's placed nowhere).
  void keep_shards() {
    for (auto& bk : buckets_)
      if (bk.values_held()) {
        bk.wait_values();
        bk.keep_value_shard();
        release(bk, /*to_pool=*/false);
      }
    pinned_ = false;
  }
  // The update changed the kept shards: gathered copies still held (a layer that skipped its
  // backward) are stale.
  void release_stale() {
    if (active())
      for (auto& bk : buckets_)
        if (bk.values_held()) release(bk, /*to_pool=*/true);
  }

  // Before the parameters are written to a checkpoint: they must be gathered.
  void require_gathered() const {
    if (active() && !pinned_)
      throw error("trainer", "state", rank_,
                  "update::" + std::string(update_.name()) + " keeps only this rank's shard of the parameters, "
                  "and they were not gathered for this state: trainer.save() gathers them, on every rank; a rank "
                  "whose world failed cannot, so resume from the last checkpoint");
  }
  // The trainer goes: a module whose parameters were not gathered gets zeros back, which rank 0
  // says (a destructor cannot gather).
  void warn_unless_gathered() const {
    if (active() && !pinned_ && rank_ == 0)
      std::fprintf(stderr,
                   "ddp: the trainer (update::%s) went without trainer.gather_parameters(), so the module gets its "
                   "parameters back as zeros; call gather_parameters() on every rank before the trainer goes to keep "
                   "the trained values, or load them from a checkpoint\n",
                   std::string(update_.name()).c_str());
  }

 private:
  // Memory for the bucket's parameters (gathered into it, or to be written), from the pool or of
  // its own, the module's values placed there.
  void hold(bucket_type& bk, bool gather, bool pooled) {
    bk.hold_values(pooled ? pool_.take(bk.padded()) : device_array<Device, float>(device_, bk.padded()), gather);
    for (const auto p : bk.parameters()) {
      params_[p].value = bk.value_memory() + params_[p].slot.offset;
      if (place_) place_(p, params_[p].value);
    }
  }
  void release(bucket_type& bk, bool to_pool) {
    for (const auto p : bk.parameters()) {
      params_[p].value = nullptr;
      if (place_) place_(p, nullptr);
      forwarded_[p] = backwarded_[p] = 0;
    }
    auto memory = bk.release_values();
    if (to_pool) pool_.give(std::move(memory));
  }

  Device& device_;
  parameter_table& params_;
  std::vector<bucket_type>& buckets_;
  memory_pool<Device>& pool_;
  const update_part& update_;
  int rank_;
  std::function<void(std::size_t, float*)> place_;  // the module's place_parameter
  std::vector<char> forwarded_, backwarded_;        // through their layer's forward, backward
  bool pinned_ = false;                             // gather_all() holds every bucket's parameters
};

}  // namespace ddp::detail
