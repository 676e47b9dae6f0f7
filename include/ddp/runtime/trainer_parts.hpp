#pragma once
// The trainer's parts that depend on the communicator and the device alone, not on the module or
// the policies: DDP_TRAINER_PART_INSTANCES(kind, Comm, Device) declares (kind: extern template)
// or defines (kind: template) their instances for one communicator and device
// (ddp/runtime/inproc.hpp, ddp/runtime/mpi.hpp, ddp/core/compiled_runtime.hpp).
#include "ddp/trainer/buffer_set.hpp"
#include "ddp/trainer/bucket.hpp"
#include "ddp/trainer/exact_sum.hpp"
#include "ddp/trainer/gradient_reducer.hpp"
#include "ddp/trainer/sync_stage.hpp"
#include "ddp/trainer/update_stage.hpp"

#define DDP_TRAINER_PART_INSTANCES(kind, Comm, Device)        \
  kind class ddp::detail::gradient_reducer<Comm, Device>;    \
  kind class ddp::detail::update_stage<Comm, Device>;        \
  kind class ddp::detail::sync_stage<Comm, Device>;          \
  kind class ddp::detail::sync_fragments<Comm, Device>;      \
  kind class ddp::detail::bucket<Comm, Device>;              \
  kind class ddp::detail::bucket_hook_io<Comm, Device>;      \
  kind class ddp::detail::control_channel<Comm, Device>;     \
  kind class ddp::detail::gradient_residency<Comm, Device>;  \
  kind class ddp::detail::parameter_residency<Comm, Device>; \
  kind class ddp::detail::residency_hooks<Comm, Device>;     \
  kind class ddp::detail::buffer_set<Comm, Device>;          \
  kind class ddp::detail::buffer_sync_context<Comm, Device>; \
  kind class ddp::detail::exact_sum<Comm, Device>;
