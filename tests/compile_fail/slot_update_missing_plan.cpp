// expect: a policy in the update slot lacks `ddp::update::layout plan\(std::size_t numel, int rank
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

struct no_plan {
  using slot = ddp::update::slot;
  static constexpr std::string_view name = "no_plan";
  static constexpr ddp::update::memory_plan memory{};
};
int main() { test::build_and_step<ddp::trainer<test::minimal_module, no_plan>>(); }
