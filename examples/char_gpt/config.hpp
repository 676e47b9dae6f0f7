#pragma once
// The example's settings (main.cpp parses them) and what a run reports: kept free of the trainer,
// so the command line's translation unit compiles in a few seconds.
#include <cstddef>
#include <cstdint>
#include <string>

#include "../common/policy_flags.hpp"

namespace char_gpt {

inline constexpr const char* default_corpus_directory = "/usr/share/games/fortunes";

// The policy flags (examples/common/policy_flags.hpp: --reduction, --update, --hook, ...) and the
// example's own. The defaults are nanoGPT's recipe for a CPU at 2 ranks.
struct config : examples::policy_flags {
  config() { optimizer = "adamw"; }
  int ranks = 2;
  std::size_t steps = 2000;
  std::size_t batch = 12;         // sequences per rank per step
  std::size_t global_batch = 0;   // sequences per step over all ranks; 0: batch x ranks
  std::size_t context = 64, layers = 4, heads = 4, width = 128;
  bool causal = true;
  float lr = 1e-3f, min_lr = 1e-4f;  // peak, and at the last step (a cosine over all the steps, times the warm-up ramp)
  std::size_t warmup = 100;          // steps of linear warm-up
  float weight_decay = 0.1f, beta1 = 0.9f, beta2 = 0.99f, momentum = 0.9f, clip = 1.0f;
  std::uint64_t seed = 1;
  std::string corpus = default_corpus_directory;
  std::size_t log_every = 100;        // steps between progress lines
  std::size_t eval_every = 500;       // steps between validation losses (on eval_sequences of them; 0: at the end only)
  std::size_t eval_sequences = 512;   // validation sequences evaluated during training (0: all)
  std::size_t final_eval_sequences = 0;  // and after the last step (0: all, every byte of the validation text once)
  std::size_t checkpoint_every = 500; // --checkpoint: steps between saves (and one after the last step)
  std::string checkpoint;         // a directory: resume from it when it holds one, save every checkpoint_every steps
  std::size_t keep_last = 1;
  std::size_t prefetch = 0;
  std::size_t sample_chars = 300;  // generated at the end
  float temperature = 0.8f;        // 0: greedy
  std::string prompt = "The ";
  std::string backend = "inproc";
  bool progress = true;
};

struct report {
  std::size_t steps = 0;
  double train_loss = 0;          // over the last log interval
  double validation_loss = 0;     // after the last step, over --final-eval-sequences (all)
  std::size_t validation_sequences = 0;
  double train_seconds = 0;       // the steps alone, evaluations not counted
  double tokens_per_second = 0;
  std::size_t parameters = 0;
  std::string policies;
  std::string sample;
};

}  // namespace char_gpt
