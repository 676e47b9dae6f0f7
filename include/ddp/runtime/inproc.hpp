#pragma once
// The trainer's parts over the in-process communicator and the host device, compiled once in
// libddp_runtime (ddp::runtime): with DDP_COMPILED_RUNTIME=1, <ddp/ddp.hpp> includes this, and a
// translation unit no longer compiles them for each trainer (ddp/core/compiled_runtime.hpp).
#include "ddp/host/device.hpp"
#include "ddp/inproc/communicator.hpp"
#include "ddp/core/compiled_runtime.hpp"
#include "ddp/runtime/trainer_parts.hpp"
#include "ddp/trainer/buffer_group.hpp"
#include "ddp/trainer/master_weights.hpp"
#include "ddp/trainer/memory_pool.hpp"

#if DDP_RUNTIME_EXTERN
DDP_TRAINER_PART_INSTANCES(extern template, ddp::inproc::communicator, ddp::host::device)
extern template class ddp::detail::buffer_group<ddp::host::device>;
extern template class ddp::detail::master_weights<ddp::host::device>;
extern template class ddp::detail::memory_pool<ddp::host::device>;
#endif
