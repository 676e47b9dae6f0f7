// expect: a policy in the update slot lacks `static constexpr ddp::update::memory_plan memory`
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

// A ZeRO-1 policy as a new user writes it, without its memory plan. One message, not a second
// from the rules that read the plan.
struct no_memory {
  using slot = ddp::update::slot;
  static constexpr std::string_view name = "no_memory";
  ddp::update::layout plan(std::size_t numel, int rank, int ranks) const {
    return ddp::update::sharded{}.plan(numel, rank, ranks);
  }
};
int main() { test::build_and_step<ddp::trainer<test::minimal_module, no_memory>>(); }
