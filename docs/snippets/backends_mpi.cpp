// The MPI snippets of docs/backends.md, compiled when OpenMPI is found (the test command
// requires it).
#include "common.hpp"

#include <ddp/mpi/communicator.hpp>
#include <ddp/mpi/environment.hpp>

namespace snippets {

int mpi_main(int argc, char** argv, const loader_type& loader) {
  // [doc: backends.md]
  #include <ddp/ddp.hpp>
  #include <ddp/mpi/communicator.hpp>
  #include <ddp/mpi/environment.hpp>

  ddp::mpi::environment env(&argc, &argv);      // MPI_Init_thread / MPI_Finalize
  ddp::mpi::communicator comm;                  // duplicates MPI_COMM_WORLD
  auto m = make_model(1);
  ddp::host::device dev;
  ddp::trainer<model, ddp::use_communicator<ddp::mpi::communicator>> trainer(m, comm, dev, ddp::optim::sgd{.lr = 0.1f});
  for (const auto& b : trainer.epoch(loader))
    trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y, b.weights).grad); });
  // [end doc]
  return 0;
}

}  // namespace snippets

// [doc: backends.md]
#include <ddp/ddp.hpp>
#include <ddp/mpi/communicator.hpp>
#include <ddp/mpi/environment.hpp>

// One rank's training, whatever started it.
template <class Communicator>
void train(Communicator& comm) {
  auto m = snippets::make_model(1);
  ddp::host::device dev;
  ddp::trainer<snippets::model, ddp::use_communicator<Communicator>> trainer(m, comm, dev);
  // ... epochs as anywhere else
}

int main(int argc, char** argv) {
  if (const auto placement = ddp::mpi::placement_from_environment()) {  // mpirun or srun started us
    ddp::mpi::environment env(&argc, &argv);
    ddp::mpi::communicator comm;
    train(comm);
  } else {                                                               // started by hand: threads
    ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) { train(comm); });
  }
}
// [end doc]

namespace snippets {

// [doc: backends.md]
#include <ddp/ddp.hpp>
#include <ddp/mpi/communicator.hpp>

using mpi_trainer = ddp::trainer<model, ddp::use_communicator<ddp::mpi::communicator>,
                                 ddp::use_device<ddp::host::device>>;
// [end doc]

}  // namespace snippets
