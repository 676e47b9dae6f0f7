// expect: a collective per forward \(buffer_sync::broadcast_each_forward\) would pair with another rank's reduction
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

// Ranks hold floor or ceil of V / N shards, one forward each: a broadcast per forward would meet
// another rank's bucket reduction when N does not divide V.
int main() {
  test::build_and_step<ddp::trainer<test::minimal_module, ddp::reduction::invariant<4>,
                                    ddp::buffer_sync::broadcast_each_forward>>();
}
