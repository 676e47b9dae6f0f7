#pragma once
// A sync schedule's streaming fragments in flight (streaming DiLoCo with Delay >= 1; the sync
// stage launches and applies them, sync_stage.hpp): each fragment's pseudo-gradient is reduced
// through the hook in memory of its own, since the inner steps go on in the buckets' memory, and
// its collectives are held here until the step after whose update it is applied. In launch order,
// as every rank launches them.
//
// A fragment's reduction completes in two phases, as every sync's: its collectives waited for
// and their failures read back, then the hook's finish over its memory (finish); only then may
// the stage change a parameter. One whose reduction failed is dropped (drain), or every one is
// (drop, for the ranks that go on after a failure, on every rank alike).
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"
#include "ddp/concepts/work.hpp"
#include "ddp/trainer/bucket.hpp"
#include "ddp/trainer/checkpoint_file.hpp"

namespace ddp::detail {

template <communicator Comm, device Device>
class sync_fragments {
 public:
  using bucket_type = bucket<Comm, Device>;
  using work_type = typename bucket_type::work_type;

  // One fragment's sync, from its launch to its application.
  struct pending {
    std::size_t fragment = 0;
    std::uint64_t apply_at = 0;    // the step after whose update it is applied
    std::vector<work_type> works;  // Delay >= 1: the hook's collectives in flight (none after a load)
    bool finished = false;         // the averaged pseudo-gradient is in place (the hook finished)
  };

  explicit sync_fragments(Device& dev) : device_(dev) {}
  sync_fragments(const sync_fragments&) = delete;
  sync_fragments& operator=(const sync_fragments&) = delete;
  ~sync_fragments() { drain(); }

  // The memory of every bucket's reduction in flight, made on first use (a schedule chosen at
  // run time may start streaming after construction).
  bool has_memory() const noexcept { return !memory_.empty(); }
  void make_memory(std::span<bucket_type> buckets) {
    for (auto& bk : buckets) memory_.push_back(zeroed_array<float>(device_, bk.padded()));
  }
  float* memory(std::size_t b) noexcept { return memory_[b].data(); }
  std::size_t bytes() const noexcept {
    std::size_t n = 0;
    for (const auto& m : memory_) n += m.size() * sizeof(float);
    return n;
  }

  // The fragments in flight, in launch order.
  std::vector<pending>& in_flight() noexcept { return pending_; }
  void add(pending p) { pending_.push_back(std::move(p)); }
  void pop_front() { pending_.erase(pending_.begin()); }

  // Phase one of `p`'s sync (its buckets: fragment, fragment + stride, ...; launched at step
  // `begun`): its collectives completed (a failure thrown), then the hook's finish over its memory.
  void finish(pending& p, std::span<bucket_type> buckets, std::size_t stride, std::uint64_t begun) {
    if (p.finished) return;
    if (const auto failed = wait_quietly(p)) std::rethrow_exception(failed);
    for (std::size_t b = p.fragment; b < buckets.size(); b += stride) buckets[b].finish_held(memory(b), begun);
    if constexpr (stream_ordered_work<work_type>) device_.synchronize();
    p.finished = true;
  }

  // Waits for the fragments in flight; one whose reduction failed (a peer was lost) is dropped:
  // its sync is skipped, and it syncs again at its next turn.
  void drain() noexcept {
    std::erase_if(pending_, [&](pending& p) { return wait_quietly(p) != nullptr; });
  }
  // Every fragment in flight dropped, whether or not its reduction completed here.
  void drop() noexcept {
    for (auto& p : pending_) wait_quietly(p);
    pending_.clear();
  }

  // ---- checkpoint sections: each fragment in flight completed (`delay`: steps from its launch to
  // its application) and its averaged pseudo-gradient saved, to be applied at its step after a load

  void write_state(checkpoint_file& f, std::span<bucket_type> buckets, std::size_t stride, std::uint64_t delay) {
    std::vector<std::uint64_t> entries;
    for (auto& p : pending_) {
      finish(p, buckets, stride, p.apply_at - delay);
      entries.insert(entries.end(), {p.fragment, p.apply_at});
      for (std::size_t b = p.fragment; b < buckets.size(); b += stride) {
        std::vector<float> host(buckets[b].numel());
        if (!host.empty()) device_.copy_to_host(host.data(), memory(b), host.size() * sizeof(float));
        f.set_array("sync/in_flight/" + std::to_string(b), std::span<const float>(host));
      }
    }
    f.set_array("sync/pending", std::span<const std::uint64_t>(entries));
  }
  void read_state(const checkpoint_file& f, std::span<bucket_type> buckets, std::size_t stride) {
    drop();
    const auto entries = f.array<std::uint64_t>("sync/pending", f.section("sync/pending").size() / sizeof(std::uint64_t));
    for (std::size_t k = 0; k + 1 < entries.size(); k += 2) {
      pending_.push_back({static_cast<std::size_t>(entries[k]), entries[k + 1], {}, true});
      for (std::size_t b = entries[k]; b < buckets.size(); b += stride) {
        const std::size_t n = buckets[b].numel();
        device_.fill_zero(memory(b), memory_[b].size() * sizeof(float));
        device_.copy_from_host(memory(b), f.array<float>("sync/in_flight/" + std::to_string(b), n).data(),
                               n * sizeof(float));
      }
    }
  }

 private:
  // Waits for every reduction of `p` (after a failure too, so that none is left in flight) and,
  // on a stream backend, reads their failures back; returns the first failure.
  std::exception_ptr wait_quietly(pending& p) noexcept {
    std::exception_ptr failed;
    for (auto& w : p.works) try {
        w.wait();
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
    if constexpr (stream_ordered_work<work_type>) {
      if (!p.works.empty()) try {
          device_.synchronize();
          for (const auto& w : p.works) rethrow_failure(w);
        } catch (...) {
          if (!failed) failed = std::current_exception();
        }
    }
    p.works.clear();
    return failed;
  }

  Device& device_;
  std::vector<device_array<Device, float>> memory_;  // per bucket, padded floats: a fragment's reduction
  std::vector<pending> pending_;                     // in launch order
};

}  // namespace ddp::detail
