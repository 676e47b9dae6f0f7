// expect: use comm_hook::none with reduction::invariant
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

// An exact, world-size-invariant sum of gradients that a hook has compressed first would not be
// invariant: the compression's rounding depends on the world size.
int main() { test::build_and_step<ddp::trainer<test::minimal_module, ddp::reduction::invariant<4>, ddp::comm_hook::bf16>>(); }
