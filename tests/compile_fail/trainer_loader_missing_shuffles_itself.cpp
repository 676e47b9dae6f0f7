// expect: the loader lacks `static constexpr bool shuffles_itself`
#include <ddp/ddp.hpp>

#include <vector>

#include "support/minimal_module.hpp"

// A user's loader, written without the member the trainer's P4 check reads.
struct my_loader {
  std::size_t dataset_size() const { return 10; }
  std::vector<int> batches(const std::vector<std::size_t>& indices) const { return std::vector<int>(indices.size()); }
};

void epoch_of(ddp::trainer<test::minimal_module>& trainer, my_loader& loader) { (void)trainer.epoch(loader); }
int main() {}
