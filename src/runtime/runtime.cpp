// libddp_runtime (CMake target ddp::runtime): the code of ddp that does not depend on a user's
// types, compiled once (ddp/core/compiled_runtime.hpp). Built with DDP_BUILDING_RUNTIME defined, in one
// translation unit: each function defined here must be defined once.
#include "ddp/data/fashion_mnist.hpp"
#include "ddp/data/idx.hpp"
#include "ddp/data/mapped_idx.hpp"
#include "ddp/ddp.hpp"
#include "ddp/host/kernels.hpp"
#include "ddp/nn/attention.hpp"
#include "ddp/nn/batch_norm.hpp"
#include "ddp/nn/cross_entropy.hpp"
#include "ddp/nn/gelu.hpp"
#include "ddp/nn/gpt.hpp"
#include "ddp/nn/layer_norm.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/nn/sequence_cross_entropy.hpp"
#include "ddp/nn/transformer_block.hpp"
#include "ddp/runtime/inproc.hpp"
#include "ddp/trainer/epoch_position.hpp"

#ifndef DDP_BUILDING_RUNTIME
#error "libddp_runtime is built with DDP_BUILDING_RUNTIME defined (CMake target ddp_runtime)"
#endif

namespace ddp::host {
DDP_HOST_KERNEL_INSTANCES(template)
}  // namespace ddp::host

DDP_TRAINER_PART_INSTANCES(template, ddp::inproc::communicator, ddp::host::device)
template class ddp::detail::buffer_group<ddp::host::device>;
template class ddp::detail::master_weights<ddp::host::device>;
template class ddp::detail::memory_pool<ddp::host::device>;
