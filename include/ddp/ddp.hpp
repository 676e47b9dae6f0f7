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
