// libddp_mpi_runtime (CMake target ddp::mpi_runtime): the MPI communicator and the trainer's parts
// over it, compiled once (ddp/core/compiled_runtime.hpp). Built with DDP_BUILDING_MPI_RUNTIME defined,
// against libddp_runtime (DDP_COMPILED_RUNTIME=1), in one translation unit.
#include "ddp/mpi/communicator.hpp"
#include "ddp/runtime/mpi.hpp"

#ifndef DDP_BUILDING_MPI_RUNTIME
#error "libddp_mpi_runtime is built with DDP_BUILDING_MPI_RUNTIME defined (CMake target ddp_mpi_runtime)"
#endif

DDP_TRAINER_PART_INSTANCES(template, ddp::mpi::communicator, ddp::host::device)
