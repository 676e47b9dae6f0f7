// expect: use update::replicated with this schedule
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

// Between syncs every rank updates every parameter itself, which needs the whole optimizer state.
int main() {
  test::build_and_step<ddp::trainer<test::minimal_module, ddp::update::sharded, ddp::sync_schedule::local_sgd<4>>>();
}
