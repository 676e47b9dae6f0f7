// A user's optimizer on the CUDA device: its element kernel, instantiated in the user's own nvcc
// translation unit (docs/cuda.md). kernels_test.cpp checks it against its formula (the device
// conformance suite).
// [doc: cuda.md]
#include <ddp/cuda/elementwise.cuh>
#include "support/user_optimizer.hpp"   // user::lion, its rule's operator() marked DDP_HOST_DEVICE

DDP_CUDA_OPTIMIZER(user::lion);
// [end doc]
