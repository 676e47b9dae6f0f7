// expect: the optimizer lacks `Rule at\(std::int64_t step\) const`
#include <ddp/ddp.hpp>

#include "support/minimal_module.hpp"

// An optimizer without an element rule: before, a user optimizer fell into the AdamW branch.
struct rule_less {
  using slot = ddp::optim::slot;
  static constexpr std::string_view name = "rule_less";
  static constexpr int state_slots = 1;
  float lr = 0.1f;
  std::string describe() const { return "rule_less"; }
};
static_assert(sizeof(ddp::trainer<test::minimal_module, rule_less>) > 0);
int main() {}
