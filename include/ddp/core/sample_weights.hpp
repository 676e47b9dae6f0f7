#pragma once
// How much each sample of a batch counts, so that padding counts for nothing: a sampler that pads
// (sampler::distributed<..., tail::pad>) repeats a few samples so every rank gets as many, and
// the loader marks the repeats with weight 0.
//
// A loss that honours them divides this rank's weighted sum by divisor(): the trainer averages
// the ranks' gradients, so the step's gradient is then the mean over exactly the real samples of
// the step's global batch, as one process over the data set would take it.
#include <cstddef>
#include <vector>

namespace ddp {

struct sample_weights {
  std::vector<float> per_sample;  // 1 for a sample, 0 for padding
  double step_total = 0.0;        // the weights' sum over every rank's batch of this step
  int world = 1;

  double divisor() const { return step_total / static_cast<double>(world); }
  // This rank's weights' sum: its count for a reduced metric.
  double total() const {
    double sum = 0.0;
    for (float w : per_sample) sum += static_cast<double>(w);
    return sum;
  }
};

}  // namespace ddp
