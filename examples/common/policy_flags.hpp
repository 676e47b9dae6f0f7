#pragma once
// The flags every example takes for the trainer's policies: policy_cli.hpp parses them,
// policy_choice.hpp turns them into a trainer type. Kept free of the trainer.
#include <cstddef>
#include <cstdint>
#include <string>

namespace examples {

struct policy_flags {
  std::string reduction = "plain";  // or "invariant": 8 virtual shards per step, the same bits at 1 to 8 ranks
  std::string buffer_sync = "broadcast_once_per_step";
  std::string unused_params = "forbid";
  std::string sampler = "distributed";
  std::string optimizer = "sgd";
  std::string update = "replicated";
  bool overlap_optimizer = false;   // each bucket updated as soon as its reduction completes
  std::string hook = "none";        // how gradients travel: none (f32), bf16, fp16, powersgd (rank 4) or int8_rows
  std::uint64_t hook_start = 1000;  // powersgd: plain steps first
  std::string precision = "f32";    // the model's parameters: f32, or bf16 / f16 with the trainer's f32 master
  std::string sync = "every_step";  // or local_sgd / diloco: ranks step alone between syncs
  std::uint64_t sync_period = 32;   // local_sgd / diloco: steps between syncs
  std::uint64_t sync_warmup = 0;    // local_sgd: every-step syncs first
  float outer_lr = 0.7f, outer_momentum = 0.9f;  // diloco's outer Nesterov SGD
  std::size_t sync_fragments = 4, sync_delay = 1;  // streaming_diloco: fragments, steps a reduction overlaps
  float sync_mixing = 0.5f;                       // streaming_diloco: the local parameters' share at a sync
};

}  // namespace examples
