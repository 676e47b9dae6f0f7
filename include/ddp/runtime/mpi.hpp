#pragma once
// The trainer's parts over the MPI communicator and the host device, compiled once in
// libddp_mpi_runtime (ddp::mpi_runtime): with DDP_COMPILED_MPI_RUNTIME=1,
// <ddp/ddp.hpp> includes this (ddp/core/compiled_runtime.hpp).
#include "ddp/host/device.hpp"
#include "ddp/mpi/communicator.hpp"
#include "ddp/core/compiled_runtime.hpp"
#include "ddp/runtime/trainer_parts.hpp"

#if DDP_MPI_RUNTIME_EXTERN
DDP_TRAINER_PART_INSTANCES(extern template, ddp::mpi::communicator, ddp::host::device)
#endif
