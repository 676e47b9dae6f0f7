// Run under mpirun: rank 1 fails inside a training step while the others wait in a collective.
// Expected: the job ends (no hang) and the output names rank 1 and the failure.
#include "ddp/ddp.hpp"
#include "ddp/host/device.hpp"
#include "ddp/mpi/communicator.hpp"
#include "trainer/test_model.hpp"

int main(int argc, char** argv) {
  ddp::mpi::environment env(&argc, &argv);
  ddp::mpi::communicator comm;
  test::branchy model(5);
  ddp::host::device dev;
  ddp::trainer<test::branchy, ddp::use_communicator<ddp::mpi::communicator>> trainer(model, comm, dev, {});
  auto b = test::make_batch(6, 20);
  trainer.step([&](auto& r) {
    auto out = r.forward(b.x);
    if (comm.rank() == 1) throw std::runtime_error("loss is NaN on rank 1");
    r.backward(ddp::nn::softmax_cross_entropy(out, b.y).grad);
  });
  return 0;
}
