// expect: a policy in the update slot lacks `static constexpr bool gathers_parameters`
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

// A ZeRO-2 policy as a new user writes it: it keeps only its shard of the gradients but forgot
// gathers_parameters. One message, not a second from the rule that reads the missing member.
struct no_gathers {
  using slot = ddp::update::slot;
  static constexpr std::string_view name = "no_gathers";
  static constexpr std::size_t gradient_buckets_in_flight = 2;
  ddp::update::layout plan(std::size_t numel, int rank, int ranks) const {
    return ddp::update::sharded{}.plan(numel, rank, ranks);
  }
  void reduce(ddp::update::bucket_ops& b) { b.reduce_scatter_gradients(); }
  void after_update(ddp::update::bucket_ops& b) { b.all_gather_parameters(); }
  void finish(ddp::update::bucket_ops& b) { b.finish_parameters(); }
};
int main() { test::build_and_step<ddp::trainer<test::minimal_module, no_gathers>>(); }
