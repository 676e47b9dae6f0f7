// expect: so it places the module.s gradients layer by layer in backward
#include <ddp/ddp.hpp>

#include "support/minimal_module.hpp"

// update::sharded_gradients places the module's gradients layer by layer in backward; a module
// without layer hooks and place_gradient cannot be trained that way.
static_assert(sizeof(ddp::trainer<test::minimal_module, ddp::update::sharded_gradients>) > 0);
int main() {}
