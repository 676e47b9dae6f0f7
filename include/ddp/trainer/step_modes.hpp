#pragma once
// The rules of the step's modes beside the plain step: what runs between steps only, when a rank
// may join() (shadow the others' steps), and when a step may be captured (a CUDA graph replays
// it). Each rule reads a few facts of the reducer and its policies, every rank alike.
#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "ddp/core/error.hpp"
#include "ddp/trainer/parameter_table.hpp"

namespace ddp::detail {

struct step_mode_facts {
  std::string_view update;         // the update policy's name
  bool shards_parameters = false;  // it keeps only this rank's shard of the parameters
  bool releases_gradients = false;  // ... of the gradients
  std::size_t virtual_shards = 0;  // reduction::invariant<V>
  std::string_view hook;           // the communication hook's name
  bool hook_capturable = false;
  std::size_t micro_batches = 0;   // since the last update
  int rank = 0;
};

// For what runs between steps only: join() (their gradients would go in with nothing to count
// them) and zero_gradients() (it would discard them).
inline void require_no_micro_batches(const step_mode_facts& f, const char* operation) {
  if (f.micro_batches != 0)
    throw error("trainer", operation, f.rank,
                std::to_string(f.micro_batches) + " accumulate() micro-batch(es) have no step(); finish them with "
                "step() before " + operation + "(), between steps");
}

// join(): between steps; and a joined rank shadows the others' steps, but under an exact sum a
// step is the V virtual shards, whatever the ranks hold.
inline void require_joinable(const step_mode_facts& f) {
  if (f.shards_parameters)  // every rank alike: nobody waits
    throw collective_error("trainer", "join", f.rank,
                "update::" + std::string(f.update) + " gathers each layer's parameters in forward and "
                "backward, collectives that a joined rank, which runs neither, cannot mirror: give every rank as "
                "many batches (trainer.epoch_shards(loader), or a sampler that drops the last uneven ones) and "
                "leave join() out, or use update::sharded_gradients");
  if (const std::size_t v = f.virtual_shards)
    throw error("trainer", "join", f.rank,
                "under reduction::invariant<" + std::to_string(v) + "> every step is its " + std::to_string(v) +
                    " virtual shards, so no rank runs out of batches before the others: deal the data with "
                    "trainer.epoch_shards(loader), whose shards have as many batches each (repeats weighing "
                    "nothing), and leave join() out");
  require_no_micro_batches(f, "join");
}

// Why a step cannot be captured now, or nothing.
inline std::optional<std::string> capture_refusal(const step_mode_facts& f) {
  if (f.micro_batches != 0) return "accumulate() micro-batches are waiting for their step(); capture between steps";
  if (f.releases_gradients)
    return "update::" + std::string(f.update) + " allocates and frees the buckets' gradients in every "
           "step, which a captured step cannot; use update::sharded to capture";
  if (f.virtual_shards)
    return "reduction::invariant sums each step's micro-batches on the host, which a captured step cannot; "
           "run it uncaptured";
  if (!f.hook_capturable)
    return "the communication hook '" + std::string(f.hook) +
           "' keeps host-side state per step; capture with comm_hook::none, fp16 or bf16";
  return std::nullopt;
}

// A captured step reads nothing on the host, so the control floats neither go nor come back:
// each replay is this one micro-batch on every rank (the mean is 1), and every parameter must
// get a gradient in it (`used`), as every replay then updates every one.
inline void require_replayable_step(const step_mode_facts& f, std::span<const char> used, const parameter_table& params) {
  if (f.micro_batches != 1)
    throw error("trainer", "capture", f.rank,
                "the captured step ran " + std::to_string(f.micro_batches) +
                    " micro-batches; a captured step is one forward-backward pair and its update");
  if (const auto it = std::find(used.begin(), used.end(), 0); it != used.end())
    throw error("trainer", "capture", f.rank,
                "parameter '" + params.name(static_cast<std::size_t>(it - used.begin())) + "' got no gradient in "
                "the captured step, but every replay updates every parameter: capture a step that uses them all, "
                "or run such steps uncaptured");
}

}  // namespace ddp::detail
