// expect: use sync_schedule::every_step with reduction::invariant
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

// Local steps depend on how the data is spread over the ranks, so no step is the same bits at
// every world size.
int main() {
  test::build_and_step<ddp::trainer<test::minimal_module, ddp::reduction::invariant<4>, ddp::sync_schedule::diloco<8>>>();
}
