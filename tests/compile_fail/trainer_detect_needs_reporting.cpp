// expect: need a module that reports ready gradients
#include <ddp/ddp.hpp>

#include "support/minimal_module.hpp"

struct silent_module : test::minimal_module {  // never reports ready gradients
  static constexpr bool reports_gradient_ready = false;
};
static_assert(sizeof(ddp::trainer<silent_module, ddp::unused_params::detect_each_step>) > 0);
int main() {}
