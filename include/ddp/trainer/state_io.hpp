#pragma once
// A trainer's state in a checkpoint file: each component writes, checks and reads its own
// sections (the table the signature and parameters, buffer_set the buffers, the reducer the
// bucket layout and hook state, the update stage the optimizer state and update counts), and
// the step count. ddp::trainer::save and load (checkpoint.hpp) go through it.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/trainer/buffer_set.hpp"
#include "ddp/trainer/checkpoint_file.hpp"
#include "ddp/trainer/gradient_reducer.hpp"
#include "ddp/trainer/master_weights.hpp"
#include "ddp/trainer/parameter_table.hpp"
#include "ddp/trainer/sync_stage.hpp"
#include "ddp/trainer/update_stage.hpp"

namespace ddp::detail {

template <communicator Comm, device Device>
struct trainer_state {
  Device& device;
  parameter_table& params;
  master_weights<Device>& masters;
  buffer_set<Comm, Device>& buffers;
  gradient_reducer<Comm, Device>& reducer;
  update_stage<Comm, Device>& update;
  sync_stage<Comm, Device>& sync;
  std::uint64_t& steps;

  void write(checkpoint_file& f) const {
    update.require_whole(steps);
    reducer.parameters().require_gathered();
    sync.complete_in_flight(reducer.buckets());  // before the hook's state is written
    f.set_text("steps", std::to_string(steps));
    params.write_state(f, device);
    buffers.write_state(f);
    reducer.write_state(f);
    update.write_state(f);
    sync.write_state(f, reducer.buckets());
  }
  // Why `f` cannot be loaded here (another model, bucket plan, optimizer, hook state), or nothing.
  std::optional<std::string> check(const checkpoint_file& f) const {
    if (auto why = params.check_state(f)) return why;
    if (auto why = reducer.check_buckets(f)) return why;
    if (auto why = update.check_state(f)) return why;
    if (auto why = sync.check_state(f)) return why;
    return reducer.check_hook_state(f);
  }
  // `own` is the file whose parameters, buffers and counts this rank takes; the optimizer state
  // is assembled from every file's shard (re-cut for another world size).
  void read(const std::vector<checkpoint_file>& files, std::size_t own) {
    reducer.parameters().hold_all();  // sharded parameters: memory for the file's values, this rank's shard kept
    params.read_state(files[own], device);
    reducer.stage_values();
    masters.round_into_module();
    buffers.read_state(files[own]);
    update.read_state(files, own, reducer.buckets());
    steps = files[own].number("steps");
    reducer.read_state(files);
    sync.read_state(files[own], reducer.buckets());
    device.synchronize();
  }
  // A rank that joins an elastic run, after read(): it starts from the sync schedule's anchor, the
  // ranks' common point, not from the peer's inner progress (sync_stage::start_from_anchor).
  void start_from_anchor() const {
    if (!sync.start_from_anchor(reducer.buckets())) return;
    masters.round_into_module();
    device.synchronize();
  }
};

}  // namespace ddp::detail
