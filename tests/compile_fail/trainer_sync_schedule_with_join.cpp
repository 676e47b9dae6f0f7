// expect: use sync_schedule::every_step with join\(\)
// errors: 1
#include <ddp/ddp.hpp>

#include "support/minimal_module.hpp"

// A joined rank shadows its peers' reductions, which local steps do not issue.
int main() {
  ddp::inproc::launch(1, [](ddp::inproc::communicator& comm) {
    test::minimal_module m;
    ddp::host::device dev;
    ddp::trainer<test::minimal_module, ddp::sync_schedule::diloco<8>> trainer(m, comm, dev);
    trainer.join();
  });
}
