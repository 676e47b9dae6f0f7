// expect: the trainer's communicator is not defined here. The default, ddp::inproc::communicator, comes with #include <ddp/ddp.hpp>
#include <ddp/trainer/trainer.hpp>

#include "support/minimal_module.hpp"

// trainer.hpp names the default engines but does not pull them in: <ddp/ddp.hpp> does.
static_assert(sizeof(ddp::trainer<test::minimal_module>) > 0);
int main() {}
