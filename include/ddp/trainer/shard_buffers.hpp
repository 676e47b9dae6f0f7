#pragma once
// The module's buffers under reduction::invariant<V>: their values after a step must not depend
// on how the step's V virtual shards were spread over the ranks.
//
// A module that defers its buffer updates (ddp::defers_buffer_updates: ddp::nn::batch_norm and
// ddp::nn::sequential do) records one update per training forward instead of applying it; at the
// end of the step every rank's records are gathered in rank order, which is shard order
// (sampler::virtual_shards gives rank r the shards after rank r - 1's), and every rank applies
// all V in that order: the buffers become what one rank running the V shards in turn makes them.
//
// Any other change of a buffer during a step would depend on the world size: the step fails on
// every rank, naming the buffer. Buffers with a version counter are checked by it, others by
// their bytes.
//
// A module that draws random numbers in training (ddp::keys_random_streams: ddp::nn::dropout in a
// ddp::nn::sequential) draws each micro-batch's from a stream keyed by the step and the virtual
// shard it runs, so a shard's dropout mask does not depend on where it runs either.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"
#include "ddp/concepts/module.hpp"
#include "ddp/core/error.hpp"
#include "ddp/sampler/virtual_shards.hpp"
#include "ddp/trainer/buffer_set.hpp"

namespace ddp::detail {

template <class Module, communicator Comm, device Device>
class shard_buffers {
  static constexpr bool defers = defers_buffer_updates<Module>;

 public:
  // `shards`: V, or 0 under the plain reduction (then nothing here acts).
  shard_buffers(Module& module, Comm& comm, Device& dev, const buffer_set<Comm, Device>& buffers, std::size_t shards)
      : module_(module), comm_(comm), device_(dev), buffers_(buffers), shards_(shards) {
    if constexpr (defers)
      if (shards_) module_.defer_buffer_updates(true);
  }
  ~shard_buffers() {
    if constexpr (defers)
      if (shards_) module_.defer_buffer_updates(false);
  }
  shard_buffers(const shard_buffers&) = delete;
  shard_buffers& operator=(const shard_buffers&) = delete;

  // Micro-batch `index` of the step (0 the first) begins: it is this rank's index-th virtual shard,
  // and a module that draws random numbers draws them keyed by the step and that shard.
  void micro_batch_begins(std::uint64_t step, std::size_t index) {
    if constexpr (keys_random_streams<Module>)
      if (shards_)
        module_.set_random_stream(step * shards_ + sampler::virtual_shards(shards_, comm_.rank(), comm_.size()).first + index);
  }

  // The step's first forward is about to run (after the buffer-sync policy's own writes).
  void step_began() {
    if (!shards_) return;
    const auto& entries = buffers_.entries();
    versions_.resize(entries.size());
    bytes_.resize(entries.size());
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const auto& b = entries[i];
      if (b.version) {
        versions_[i] = b.version->value();
      } else {
        bytes_[i].resize(b.value.bytes());
        device_.copy_to_host(bytes_[i].data(), b.value.data, bytes_[i].size());
      }
    }
  }

  // The step's micro-batches have all run: fails on every rank alike when a buffer changed on
  // any, then applies every rank's deferred updates in shard order. Collective (two small
  // all_gathers) when the module has buffers.
  void step_ended() {
    if (!shards_ || (!defers && buffers_.entries().empty())) return;
    std::vector<float> mine;
    if constexpr (defers) mine = module_.take_buffer_updates();
    // Per rank: its records' length, and 1 + the index of a buffer it saw change (0: none).
    const auto heads = gather<std::int64_t>({static_cast<std::int64_t>(mine.size()), changed_buffer() + 1}, 2);
    const std::size_t world = static_cast<std::size_t>(comm_.size());
    for (std::size_t r = 0; r < world; ++r)
      if (heads[2 * r + 1] != 0) fail_changed(static_cast<std::size_t>(heads[2 * r + 1] - 1), r);
    if constexpr (defers) apply_in_shard_order(std::move(mine), heads);
  }

 private:
  std::int64_t changed_buffer() {
    const auto& entries = buffers_.entries();
    for (std::size_t i = 0; i < entries.size() && i < versions_.size(); ++i) {
      const auto& b = entries[i];
      if (b.version) {
        if (b.version->value() != versions_[i]) return static_cast<std::int64_t>(i);
        continue;
      }
      std::vector<std::uint8_t> now(b.value.bytes());
      device_.copy_to_host(now.data(), b.value.data, now.size());
      if (now != bytes_[i]) return static_cast<std::int64_t>(i);
    }
    return -1;
  }

  [[noreturn]] void fail_changed(std::size_t buffer, std::size_t rank) const {
    throw collective_error(
        "trainer", "step", comm_.rank(),
        "buffer '" + buffers_.entries().at(buffer).name + "' changed during a step on rank " + std::to_string(rank) +
            " under reduction::invariant<" + std::to_string(shards_) + ">; a buffer updated by each forward would "
            "depend on how the " + std::to_string(shards_) + " virtual shards are spread over the ranks. Give the "
            "module deferred buffer updates (defer_buffer_updates, buffer_update_size, take_buffer_updates, "
            "apply_buffer_updates: ddp::nn::batch_norm has them), or keep the buffer fixed in training");
  }

  void apply_in_shard_order(std::vector<float> mine, const std::vector<std::int64_t>& heads) {
    const std::size_t world = static_cast<std::size_t>(comm_.size());
    std::size_t longest = 0, total = 0;
    for (std::size_t r = 0; r < world; ++r) {
      longest = std::max(longest, static_cast<std::size_t>(heads[2 * r]));
      total += static_cast<std::size_t>(heads[2 * r]);
    }
    const std::size_t size = module_.buffer_update_size();
    if (total != shards_ * size)
      throw collective_error("trainer", "step", comm_.rank(),
                             "the ranks' training forwards recorded " + std::to_string(size ? total / size : total) +
                                 " buffer updates in this step, but it has " + std::to_string(shards_) +
                                 " virtual shards: run one training forward per virtual shard "
                                 "(ddp::sampler::virtual_shards)");
    if (longest == 0) return;
    mine.resize(longest, 0.0f);
    const std::vector<float> all = gather<float>(mine, longest);
    std::vector<float> ordered;
    ordered.reserve(total);
    for (std::size_t r = 0; r < world; ++r)
      ordered.insert(ordered.end(), all.begin() + static_cast<std::ptrdiff_t>(r * longest),
                     all.begin() + static_cast<std::ptrdiff_t>(r * longest + static_cast<std::size_t>(heads[2 * r])));
    module_.apply_buffer_updates(std::span<const float>(ordered));
  }

  // all_gather of `count` elements per rank, through device memory.
  template <class T>
  std::vector<T> gather(const std::vector<T>& send, std::size_t count) {
    const std::size_t world = static_cast<std::size_t>(comm_.size());
    device_array<Device, T> in(device_, count), out(device_, count * world);
    device_.copy_from_host(in.data(), send.data(), count * sizeof(T));
    auto work = comm_.all_gather(const_buffer{in.data(), count, dtype_of<T>()},
                                 mutable_buffer{out.data(), count * world, dtype_of<T>()});
    work.wait();
    std::vector<T> all(count * world);
    device_.copy_to_host(all.data(), out.data(), all.size() * sizeof(T));
    rethrow_failure(work);
    return all;
  }
  template <class T>
  static constexpr dtype dtype_of() {
    if constexpr (std::is_same_v<T, float>) return dtype::f32;
    else return dtype::i64;
  }

  Module& module_;
  Comm& comm_;
  Device& device_;
  const buffer_set<Comm, Device>& buffers_;
  std::size_t shards_;
  std::vector<std::uint64_t> versions_;          // at the step's first forward, per buffer
  std::vector<std::vector<std::uint8_t>> bytes_;  // the same, for a buffer without a version
};

}  // namespace ddp::detail
