// Run under mpirun: rank 1 is killed (SIGKILL: no handler, no message of its own) in the middle
// of its third step, while the others wait for its gradients. Expected: the job ends (no hang),
// and the launcher names the lost rank. Registered for shared memory and for TCP only (as
// between hosts).
#include <csignal>

#include "ddp/ddp.hpp"
#include "ddp/host/device.hpp"
#include "ddp/mpi/communicator.hpp"
#include "trainer/test_model.hpp"

int main(int argc, char** argv) {
  ddp::mpi::environment env(&argc, &argv);
  ddp::mpi::communicator comm;
  test::mlp model = test::make_mlp(5);
  ddp::host::device dev;
  ddp::trainer<test::mlp, ddp::use_communicator<ddp::mpi::communicator>> trainer(model, comm, dev, {});
  const auto b = test::make_batch(6, 20);
  for (int step = 0; step < 100; ++step)
    trainer.step([&](auto& r) {
      auto out = r.forward(b.x);
      if (step == 2 && comm.rank() == 1) std::raise(SIGKILL);
      r.backward(ddp::nn::softmax_cross_entropy(out, b.y).grad);
    });
  return 0;
}
