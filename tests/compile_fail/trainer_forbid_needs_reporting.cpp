// expect: or an unused parameter would pass unseen.*ddp::unused_params::unchecked
#include <ddp/ddp.hpp>

#include "support/minimal_module.hpp"

// The default policy (forbid) with a module that does not report: an unused parameter could not
// be caught, so it does not compile; unused_params::unchecked says so explicitly.
struct silent_module : test::minimal_module {
  static constexpr bool reports_gradient_ready = false;
};
static_assert(sizeof(ddp::trainer<silent_module, ddp::unused_params::unchecked>) > 0);  // fine
static_assert(sizeof(ddp::trainer<silent_module>) > 0);
int main() {}
