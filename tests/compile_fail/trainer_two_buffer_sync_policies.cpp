// expect: two policies were given for one slot
#include <ddp/ddp.hpp>

#include "support/minimal_module.hpp"

using model = test::minimal_module;
static_assert(sizeof(ddp::trainer<model, ddp::buffer_sync::none, ddp::optim::adamw,
                                  ddp::buffer_sync::broadcast_each_forward>) > 0);
int main() {}
