#pragma once
// Where a run is in its data: the sampler's seed, the epochs started, and how far the current
// epoch went, counted in micro-batches run, or in steps of epoch_shards() (the same at every
// world size). A checkpoint or a hand-over saves it (run_position) and a load continues from
// it: the next epoch then skips the batches taken before, or, when it was taken at another world
// size or batch size, is re-cut from what the epoch's order has left (the trainer asks which).
// The trainer keeps the loader-facing templates; the counts it passes in are the core's
// (run_counts, step_counts.hpp).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "ddp/core/compiled_runtime.hpp"
#include "ddp/core/error.hpp"
#include "ddp/trainer/checkpoint.hpp"
#include "ddp/trainer/step_counts.hpp"

namespace ddp::detail {

// What of the next epoch was taken before a checkpoint or a failure, when that epoch continues
// at another world size (re-cut): positions of its order at earlier world sizes, then batches of
// the last world's ranks (each rank's batch count x ranks).
struct epoch_cut {
  std::uint64_t positions = 0, batches = 0;
  std::uint64_t batch_size = 0;  // of those batches (0: not known, the loader's)
};

class epoch_position {
 public:
  explicit epoch_position(std::uint64_t seed) noexcept : seed_(seed) {}

  std::uint64_t seed() const noexcept { return seed_; }
  std::uint64_t epochs_started() const noexcept { return epoch_; }
  // The epoch that begins now; the next one after it.
  std::uint64_t next_epoch() noexcept { return epoch_++; }
  // The position count at `counts`: micro-batches run, or steps in an epoch of epoch_shards();
  // the same at the end of the last completed step.
  std::uint64_t count(const run_counts& counts) const noexcept {
    return in_shard_steps_ ? counts.steps() : counts.micro_batches_run();
  }
  std::uint64_t completed_count(const run_counts& counts) const noexcept {
    return in_shard_steps_ ? counts.steps() : counts.micro_batches_completed();
  }

  // The run continues where `saved` was (a load or a hand-over), in a world of `world` ranks.
  DDP_RUNTIME_INLINE void continue_from(const run_position& saved, int world, const run_counts& counts);
  // The position at `count`, for a checkpoint: `policies` is the trainer's line of them.
  DDP_RUNTIME_INLINE run_position at(std::uint64_t count, std::string policies, int world) const;

  // ---- an epoch begins -------------------------------------------------------------------

  // The loaded epoch's cut, when the next epoch(loader) re-cuts it: taken at another world size
  // or order offset, or (`batch_size`: the loader's, when it says) with batches of another size.
  DDP_RUNTIME_INLINE std::optional<epoch_cut> recut(std::optional<std::size_t> batch_size) const;
  // Throws when epoch_shards() with shard batches of `batch_size` cannot continue the loaded
  // epoch (its steps were taken with batches of another size); changes nothing.
  DDP_RUNTIME_INLINE void check_shard_batches(std::size_t batch_size, int rank) const;
  // An epoch with batches of `batch_size` (0: not known) takes up the loaded position.
  DDP_RUNTIME_INLINE void start(std::size_t batch_size) noexcept;
  // The order offset of a re-cut epoch's rest (`taken` of it, in the loader's batches of
  // `batch_size` when the cut does not say).
  DDP_RUNTIME_INLINE std::uint64_t recut_offset(const epoch_cut& taken, std::size_t batch_size) noexcept;
  // The epoch's batches are made: from epoch_shards() or not, re-cut or not, `length` of them
  // when the loader's range says.
  DDP_RUNTIME_INLINE void started(bool shard_steps, bool recut, const run_counts& counts,
                                  std::optional<std::size_t> length) noexcept;
  // The epoch makes no batch (and none were taken of it before a load).
  bool empty() const noexcept { return epoch_length_ == std::size_t{0} && !resume_skip_; }
  std::size_t batch_size() const noexcept { return static_cast<std::size_t>(epoch_batch_size_); }
  // The batches of the epoch a loaded checkpoint took (to skip), once; nothing after.
  DDP_RUNTIME_INLINE std::optional<std::uint64_t> take_skip() noexcept;

 private:
  std::uint64_t seed_ = 0;
  std::uint64_t epoch_ = 0;
  std::uint64_t epoch_start_ = 0;             // the position count when the current epoch began
  bool in_shard_steps_ = false;               // the current epoch came from epoch_shards()
  std::optional<std::size_t> epoch_length_;   // its batches, when the loader's range says
  std::optional<std::uint64_t> resume_skip_;  // batches of the next epoch a loaded checkpoint took
  std::optional<epoch_cut> resume_recut_;     // its cut, when it is re-cut whatever the loader
  std::optional<epoch_cut> resume_cut_;       // a checkpoint's epoch, whichever way it continues
  std::uint64_t order_offset_ = 0;      // positions of the current epoch's order taken at earlier world sizes
  std::uint64_t epoch_batch_size_ = 0;  // the current epoch's loader's (0: not known)
  // The position a load or hand-over set, until the next epoch takes it up.
  std::optional<run_position> loaded_position_;
};

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE void epoch_position::continue_from(const run_position& saved, int world, const run_counts& counts) {
  loaded_position_ = saved;
  seed_ = saved.seed;
  epoch_ = saved.epoch_finished ? saved.epochs_started : saved.epochs_started - 1;
  resume_skip_ = saved.epoch_finished ? std::nullopt : std::optional<std::uint64_t>(saved.batches_in_epoch);
  resume_recut_.reset();
  resume_cut_.reset();
  if (!saved.epoch_finished && !saved.in_shard_steps) {
    resume_cut_ = epoch_cut{saved.order_offset, static_cast<std::uint64_t>(saved.world) * saved.batches_in_epoch,
                            saved.batch_size};
    if (saved.world != world || saved.order_offset != 0) resume_recut_ = resume_cut_;
  }
  in_shard_steps_ = saved.in_shard_steps;
  epoch_start_ = count(counts);
  epoch_length_.reset();
}

DDP_RUNTIME_INLINE run_position epoch_position::at(std::uint64_t count, std::string policies, int world) const {
  // Loaded, and the next epoch has not begun: still where the checkpoint or hand-over was.
  if (loaded_position_) return *loaded_position_;
  const std::uint64_t taken = count - epoch_start_;
  return {std::move(policies), seed_, epoch_, taken, epoch_ == 0 || (epoch_length_ && taken >= *epoch_length_),
          in_shard_steps_, world, order_offset_, epoch_batch_size_};
}

DDP_RUNTIME_INLINE std::optional<epoch_cut> epoch_position::recut(std::optional<std::size_t> batch_size) const {
  if (resume_recut_) return resume_recut_;
  // Saved with another batch size: the batches taken are not as many of this loader's.
  if (batch_size && resume_cut_ && resume_cut_->batch_size != 0 && resume_cut_->batch_size != *batch_size)
    return resume_cut_;
  return std::nullopt;
}

DDP_RUNTIME_INLINE void epoch_position::check_shard_batches(std::size_t batch_size, int rank) const {
  if (resume_skip_ && loaded_position_ && loaded_position_->batch_size != 0 && batch_size != 0 &&
      loaded_position_->batch_size != batch_size)
    throw error("trainer", "epoch_shards", rank,
                "the checkpoint's epoch was taken in batches of " + std::to_string(loaded_position_->batch_size) +
                    " per virtual shard, and this loader makes batches of " + std::to_string(batch_size) +
                    ": the step's global batch is V times that, so resume with a loader of batch size " +
                    std::to_string(loaded_position_->batch_size));
}

DDP_RUNTIME_INLINE void epoch_position::start(std::size_t batch_size) noexcept {
  loaded_position_.reset();
  resume_recut_.reset();
  resume_cut_.reset();
  epoch_batch_size_ = batch_size;
  order_offset_ = 0;
}

DDP_RUNTIME_INLINE std::uint64_t epoch_position::recut_offset(const epoch_cut& taken, std::size_t batch_size) noexcept {
  order_offset_ = taken.positions + taken.batches * (taken.batch_size ? taken.batch_size : batch_size);
  return order_offset_;
}

DDP_RUNTIME_INLINE void epoch_position::started(bool shard_steps, bool recut, const run_counts& counts,
                                                std::optional<std::size_t> length) noexcept {
  if (recut) resume_skip_.reset();  // the re-cut shard holds only what was not taken
  in_shard_steps_ = shard_steps;
  epoch_start_ = count(counts);
  epoch_length_ = length;
}

DDP_RUNTIME_INLINE std::optional<std::uint64_t> epoch_position::take_skip() noexcept {
  const auto skip = resume_skip_;
  if (skip) epoch_start_ -= *skip;
  resume_skip_.reset();
  return skip;
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::detail
