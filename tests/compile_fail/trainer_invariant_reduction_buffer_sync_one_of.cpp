// expect: and a buffer_sync::one_of must not offer either
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

// A run-time choice is refused when one of its policies would be: the choice is made after the
// trainer type is fixed.
int main() {
  using sync = ddp::buffer_sync::one_of<ddp::buffer_sync::broadcast_once_per_step, ddp::buffer_sync::average_once_per_step>;
  test::build_and_step<ddp::trainer<test::minimal_module, ddp::reduction::invariant<4>, sync>>();
}
