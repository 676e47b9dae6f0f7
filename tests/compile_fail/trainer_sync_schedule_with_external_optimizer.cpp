// expect: use an optimizer the trainer applies
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

// The sync would run inside step(), before the caller's optimizer reads the averaged gradients.
int main() {
  test::build_and_step<ddp::trainer<test::minimal_module, ddp::optim::external, ddp::sync_schedule::local_sgd<4>>>();
}
