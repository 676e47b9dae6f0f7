#pragma once
// The examples' command-line flags for the trainer's policies (examples/common/policy_choice.hpp).
// CLI11 only: the translation unit that parses the command line stays free of the trainer.
#include <CLI/CLI.hpp>

#include <string>

#include "policy_flags.hpp"

namespace examples {

// Accepts exactly `value`; anything else fails with `elsewhere`, which says where it is served.
inline CLI::Validator only(std::string value, std::string elsewhere) {
  return CLI::Validator(
      [value, elsewhere](std::string& given) {
        return given == value ? std::string() : "'" + given + "' is not served by this binary: " + elsewhere;
      },
      value);
}

// --reduction, --buffer-sync, --unused-params, --sampler, --update, --overlap-optimizer, --hook,
// --hook-start; --precision where the model can hold 16-bit parameters.
inline void add_policy_options(CLI::App& app, policy_flags& c, bool precision) {
  app.add_option("--reduction", c.reduction,
                 "Reduction policy: plain (the ranks' gradients averaged in floating point), or invariant (each "
                 "step's global batch is 8 virtual shards whose gradients are summed exactly: the same bits at "
                 "1 to 8 ranks; keep --global-batch fixed, a multiple of 8)")
      ->check(CLI::IsMember({"plain", "invariant"}))
      ->capture_default_str();
  app.add_option("--buffer-sync", c.buffer_sync, "BufferSync policy")
      ->check(CLI::IsMember({"none", "broadcast_each_forward", "broadcast_once_per_step", "average_once_per_step"}))
      ->capture_default_str();
  app.add_option("--unused-params", c.unused_params, "UnusedParamDetection policy")
      ->check(CLI::IsMember({"forbid", "detect_each_step", "static_graph"}))->capture_default_str();
  app.add_option("--sampler", c.sampler, "Sampler policy")
      ->check(CLI::IsMember({"distributed", "distributed_drop", "distributed_in_order", "contiguous"}))->capture_default_str();
  app.add_option("--optimizer", c.optimizer, "optimizer")->check(CLI::IsMember({"sgd", "adamw"}))->capture_default_str();
  app.add_option("--update", c.update,
                 "Update policy: every rank updates every parameter (replicated), or each updates 1/N of them and "
                 "the ranks gather the result (sharded), also keeping only 1/N of the gradients (sharded_gradients), "
                 "and of the parameters, gathered layer by layer (fully_sharded)")
      ->check(CLI::IsMember({"replicated", "sharded", "sharded_gradients", "fully_sharded"}))->capture_default_str();
  app.add_flag("--overlap-optimizer", c.overlap_optimizer,
               "update each gradient bucket as soon as its reduction completes, while later buckets still reduce "
               "(the same bits)");
  app.add_option("--hook", c.hook,
                 "Communication hook: gradients travel in f32 (none), or divided by the world size and cast to 16 "
                 "bits (bf16, fp16), half the bytes; or as rank-4 factors of each weight matrix with error "
                 "feedback (powersgd, after --hook-start plain steps), or 8 bits per element with a scale per row "
                 "(int8_rows, all-gathered)")
      ->check(CLI::IsMember({"none", "bf16", "fp16", "powersgd", "int8_rows"}))->capture_default_str();
  app.add_option("--hook-start", c.hook_start, "powersgd: optimizer steps reduced plainly before compression starts")
      ->capture_default_str();
  app.add_option("--sync", c.sync,
                 "Sync schedule: every step's gradients averaged (every_step); or each rank steps alone and the ranks "
                 "average their parameters every --sync-period steps (local_sgd), or take DiLoCo's outer step on the "
                 "averaged pseudo-gradient (diloco), or DiLoCo fragment by fragment, each fragment's reduction "
                 "overlapping --sync-delay inner steps (streaming_diloco; the model in buckets of 1 MiB). All but "
                 "every_step: --update replicated --reduction plain --sampler distributed")
      ->check(CLI::IsMember({"every_step", "local_sgd", "diloco", "streaming_diloco"}))->capture_default_str();
  app.add_option("--sync-fragments", c.sync_fragments, "streaming_diloco: fragments synced in turn")
      ->capture_default_str();
  app.add_option("--sync-delay", c.sync_delay, "streaming_diloco: inner steps a fragment's reduction overlaps")
      ->capture_default_str();
  app.add_option("--sync-mixing", c.sync_mixing,
                 "streaming_diloco: the local parameters' share when a fragment's sync lands")
      ->capture_default_str();
  app.add_option("--sync-period", c.sync_period, "local_sgd / diloco: steps between syncs")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--sync-warmup", c.sync_warmup, "local_sgd: steps that average their gradients first")
      ->capture_default_str();
  app.add_option("--outer-lr", c.outer_lr, "diloco: the outer Nesterov SGD's learning rate")->capture_default_str();
  app.add_option("--outer-momentum", c.outer_momentum, "diloco: the outer Nesterov SGD's momentum")
      ->capture_default_str();
  if (precision)
    app.add_option("--precision", c.precision,
                   "the model's parameters: f32, or bf16 / f16 (the model holds 16 bits, the trainer an f32 master "
                   "copy that the optimizer updates; with --hook none gradients are reduced in f32)")
        ->check(CLI::IsMember({"f32", "bf16", "f16"}))->capture_default_str();
}

}  // namespace examples
