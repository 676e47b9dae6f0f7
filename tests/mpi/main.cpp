// doctest under mpirun: every process is one rank and runs every test case; MPI lives for the
// whole run (tests share one communicator through mpi_test::comm()).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "mpi/world.hpp"

namespace mpi_test {
ddp::mpi::communicator* current = nullptr;
ddp::mpi::communicator& comm() { return *current; }
}  // namespace mpi_test

int main(int argc, char** argv) {
  ddp::mpi::environment env(&argc, &argv);
  int code = 0;
  {
    ddp::mpi::communicator comm;
    mpi_test::current = &comm;
    doctest::Context context(argc, argv);
    if (comm.rank() != 0) context.setOption("out", "/dev/null");  // one report, from rank 0
    code = context.run();
    // The job fails if any rank failed.
    code = ddp::comm::all_reduce_value(comm, code, ddp::reduce_op::max);
    mpi_test::current = nullptr;
  }
  return code;
}
