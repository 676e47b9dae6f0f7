// expect: optim::external leaves the update to your optimizer
#include <ddp/ddp.hpp>

#include "support/minimal_module.hpp"

// Under update::sharded a rank holds only its shard of the averaged gradient: an optimizer of the
// caller's own would step on the rest with nothing.
static_assert(sizeof(ddp::trainer<test::minimal_module, ddp::optim::external, ddp::update::sharded>) > 0);
int main() {}
