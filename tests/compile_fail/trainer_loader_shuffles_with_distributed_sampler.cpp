// expect: this loader shuffles on its own, but the trainer's distributed sampler
#include <ddp/ddp.hpp>

#include "support/minimal_module.hpp"

using model = test::minimal_module;
// PyTorch's DataLoader(shuffle=True) beside a DistributedSampler (pitfall P4).
struct shuffling_loader {
  static constexpr bool shuffles_itself = true;
  std::size_t dataset_size() const { return 10; }
  std::vector<int> batches(const std::vector<std::size_t>&) const { return {}; }
};
void epoch(ddp::trainer<model>& t, shuffling_loader& l) { t.epoch(l); }
int main() {}
