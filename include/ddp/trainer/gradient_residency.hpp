#pragma once
// Where the buckets' full gradients live under an update policy that keeps only this rank's shard
// of them (update::sharded_gradients, update::fully_sharded): a bucket holds its full gradients
// from the backward of its first layer (the module's layer hooks) until its reduction completed,
// in memory from the pool, and the module's gradients are placed there meanwhile. Under a policy
// that keeps the gradients whole every bucket holds them always, and nothing here acts.
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/core/error.hpp"
#include "ddp/trainer/bucket.hpp"
#include "ddp/trainer/memory_pool.hpp"
#include "ddp/trainer/module_placement.hpp"
#include "ddp/trainer/parameter_table.hpp"
#include "ddp/trainer/parts.hpp"

namespace ddp::detail {

template <communicator Comm, device Device>
class gradient_residency {
 public:
  using bucket_type = bucket<Comm, Device>;

  // `place`: how the module's gradient of parameter i is pointed at memory (empty: not placed).
  gradient_residency(const parameter_table& params, memory_pool<Device>& pool, const update_part& update, int rank,
                     std::function<void(std::size_t, float*)> place)
      : params_(params), pool_(pool), update_(update), rank_(rank), place_(std::move(place)) {}
  // Holds references and state that others point into: neither copied nor moved.
  gradient_residency(const gradient_residency&) = delete;
  gradient_residency& operator=(const gradient_residency&) = delete;

  // Only this rank's shard of the gradients is kept between a bucket's completion and the update.
  bool active() const noexcept { return update_.memory().shards_gradients(); }
  // At most this many buckets hold their full gradients after their launch (0: no bound).
  std::size_t in_flight() const noexcept { return update_.memory().gradient_buckets_in_flight; }

  // Memory for the bucket's full gradients, for parameter `i`'s backward (or its launch).
  void hold(bucket_type& bk, std::size_t i) {
    if (bk.held()) return;
    if (bk.completed())
      throw error("trainer", "backward", rank_,
                  "parameter '" + params_.name(i) + "' is about to get a gradient after its bucket's reduction "
                  "completed in this step (update::" + std::string(update_.name()) + " keeps only this rank's "
                  "shard from then on): the unused-parameter policy expected no gradient for a parameter of "
                  "bucket " + std::to_string(bk.index()) + "; use unused_params::detect_each_step, or keep the "
                  "parameter out of backward");
    bk.hold_gradients(pool_.take(bk.held_floats()));
    if (place_)
      for (const auto p : bk.parameters())
        if (params_[p].type == dtype::f32) place_(p, bk.gradient_memory() + params_[p].slot.offset);
  }
  // A bucket about to launch (or to set a micro-batch aside) holds its gradients, whether or not
  // any of its parameters got one.
  void hold_all_of(bucket_type& bk) {
    if (bk.releases_gradients()) hold(bk, bk.parameters().empty() ? 0 : bk.parameters().front());
  }
  // The bucket's reduction completed: its full gradients go back to the pool (the shard stays).
  void release(bucket_type& bk) {
    if (!bk.releases_gradients() || !bk.held()) return;
    if (place_)
      for (const auto i : bk.parameters())
        if (params_[i].type == dtype::f32) place_(i, nullptr);
    pool_.give(bk.release_gradients());
  }

 private:
  const parameter_table& params_;
  memory_pool<Device>& pool_;
  const update_part& update_;
  int rank_;
  std::function<void(std::size_t, float*)> place_;  // the module's place_gradient
};

}  // namespace ddp::detail
