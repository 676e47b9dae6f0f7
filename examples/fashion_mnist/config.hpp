#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/trainer/memory_held.hpp"
#include "../common/policy_flags.hpp"

namespace fmnist {

// The policy flags (examples/common/policy_flags.hpp: --reduction, --update, --hook, ...) and the
// example's own. --hook-start's 1000 plain steps are about two epochs at the defaults.
struct config : examples::policy_flags {
  int ranks = 2;
  int epochs = 10;
  std::size_t batch = 64;  // per rank
  std::size_t global_batch = 0;  // samples per step over all ranks; 0: batch x ranks
  float lr = 0.1f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;  // 5e-4 cost 0.3 points after 3 constant-lr epochs (mean of 6 seeds)
  std::string schedule = "cosine";  // or "constant"
  std::uint64_t seed = 1;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  bool mapped = false;         // memory-map uncompressed IDX files instead of reading the .gz ones
  std::size_t prefetch = 0;    // batches made ahead on a thread per rank (0: on the rank's thread)
  std::string checkpoint;      // a directory: resume from it when it holds one, save after each epoch
  std::size_t keep_last = 1;   // --checkpoint: the checkpoints kept, the last saved
  std::string trace;           // a file: every step's phases as Chrome trace JSON (Perfetto)
  std::string backend = "inproc";
  std::string device = "cpu";
  bool progress = true;
};

struct epoch_record {
  int epoch = 0;
  double train_loss = 0, train_accuracy = 0, test_accuracy = 0, seconds = 0, samples_per_second = 0;
};

struct report {
  std::vector<epoch_record> epochs;
  double train_seconds = 0;
  double samples_per_second = 0;
  std::string policies;
  double host_waits_per_step = -1;  // on a GPU: how often a step made the host wait for it
  ddp::memory_held memory;           // rank 0's parameters, gradients and optimizer state between steps
  std::size_t memory_peak = 0;       // and the most in a step (0: not reported)
};

}  // namespace fmnist
