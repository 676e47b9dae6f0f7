// expect: a policy in the unused_params slot lacks `void after_reduction
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

struct tag_only {
  using slot = ddp::unused_params::slot;
  static constexpr std::string_view name = "tag_only";
  static constexpr bool needs_ready_reports = false;
  std::size_t control_floats(std::size_t) const { return 0; }
  void write_control(const ddp::unused_params::step_view&, std::span<float>) {}
};
int main() { test::build_and_step<ddp::trainer<test::minimal_module, tag_only>>(); }
