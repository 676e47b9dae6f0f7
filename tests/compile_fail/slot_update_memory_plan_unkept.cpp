// expect: that keeps only its shard of the gradients \(gradients_kept::shard\) updates only its shard of the parameters, so it must gather them
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

// A memory plan no rank can keep: only the shard of the gradients, every parameter whole (it
// would update only its shard of them, and never gather the rest).
struct shard_gradients_only {
  using slot = ddp::update::slot;
  static constexpr std::string_view name = "shard_gradients_only";
  static constexpr ddp::update::memory_plan memory{.gradients = ddp::update::gradients_kept::shard,
                                                   .gradient_buckets_in_flight = 2};
  ddp::update::layout plan(std::size_t numel, int rank, int ranks) const {
    return ddp::update::sharded{}.plan(numel, rank, ranks);
  }
};
int main() { test::build_and_step<ddp::trainer<test::minimal_module, shard_gradients_only>>(); }
