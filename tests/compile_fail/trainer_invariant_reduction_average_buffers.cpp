// expect: an average of N equal floats can change their last bit \(buffer_sync::average_once_per_step\)
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

// Every rank's buffers are the same after a step under reduction::invariant; averaging 3 equal
// floats (x + x + x) / 3 need not give x back, which would make the buffers depend on the world size.
int main() {
  test::build_and_step<ddp::trainer<test::minimal_module, ddp::reduction::invariant<4>,
                                    ddp::buffer_sync::average_once_per_step>>();
}
