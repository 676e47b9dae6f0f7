// ddp::mpi_runtime: the MPI communicator compiled in libddp_mpi_runtime.a (no MPI_Init: no mpirun
// here, so its code is linked, not run).
#include <ddp/mpi/communicator.hpp>

#include <string>

#if !DDP_COMPILED_MPI_RUNTIME
#error "ddp::mpi_runtime did not set DDP_COMPILED_MPI_RUNTIME"
#endif

std::string uses_mpi_runtime() {
  void (ddp::mpi::communicator::*abort)(const std::string&) = &ddp::mpi::communicator::abort;
  return abort ? "ok: ddp::mpi_runtime links the compiled MPI communicator" : "no communicator::abort";
}
