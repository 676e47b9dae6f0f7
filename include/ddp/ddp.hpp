#pragma once
// Everything the embedded default needs, in one include: the trainer with every policy, the
// in-process ranks (ddp::inproc::launch) and the host device, which are the trainer's default
// engines, the blocking collectives and the progress report (ddp::progress).
//
//   #include <ddp/ddp.hpp>
//   ddp::inproc::launch(2, [&](ddp::inproc::communicator& comm) {
//     ddp::host::device dev;
//     ddp::trainer<my_model> trainer(model, comm, dev);
//     ...
//   });
//
// The reference layers (<ddp/nn/...>, link ddp::nn), the data sets (<ddp/data/...>, ddp::data),
// MPI (<ddp/mpi/...>, ddp::mpi) and the GPU engines (<ddp/cuda/...>, <ddp/nccl/...>) have their
// own headers and components.
#include "ddp/comm/collectives.hpp"
#include "ddp/host/device.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/optim/schedule.hpp"
#include "ddp/trainer/progress.hpp"
#include "ddp/trainer/trainer.hpp"

// With ddp::runtime (DDP_COMPILED_RUNTIME=1): the trainer's parts over these engines are compiled
// in libddp_runtime, not in each translation unit; with ddp::mpi_runtime
// (DDP_COMPILED_MPI_RUNTIME=1) those over the MPI communicator too (docs/headers.md).
#include "ddp/core/compiled_runtime.hpp"
#if DDP_RUNTIME_EXTERN
#include "ddp/runtime/inproc.hpp"
#endif
#if DDP_MPI_RUNTIME_EXTERN
#include "ddp/runtime/mpi.hpp"
#endif
