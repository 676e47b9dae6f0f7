// expect: the optimizer lacks `Rule at\(std::int64_t step\) const`
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

// An optimizer without an element rule: refused with its slot's one message.
struct rule_less {
  using slot = ddp::optim::slot;
  static constexpr std::string_view name = "rule_less";
  static constexpr int state_slots = 1;
  float lr = 0.1f;
  std::string describe() const { return "rule_less"; }
};
int main() { test::build_and_step<ddp::trainer<test::minimal_module, rule_less>>(); }
