#pragma once
// What a program does with a trainer type: build one on a rank and step it. The compile-fail
// cases use it, so that a wrong policy is refused with its one message, and nothing after it.
// Include <ddp/ddp.hpp> before it (the cases take that header precompiled: first, from the case).
#include "support/minimal_module.hpp"

namespace test {

template <class Trainer>
void build_and_step() {
  ddp::inproc::launch(1, [](ddp::inproc::communicator& comm) {
    test::minimal_module m;
    ddp::host::device dev;
    Trainer trainer(m, comm, dev);
    trainer.step([](auto& replica) { replica.backward(replica.forward({})); });
  });
}

}  // namespace test
