// The one nvcc translation unit of ddp::cuda: the device's kernels, the reference layers', and
// the element kernels of the optimizers ddp ships. CMake adds it to every target that links
// ddp::cuda (built once in ddp's own tree).
#include "ddp/cuda/elementwise.cuh"
#include "ddp/cuda/kernels.cuh"
#include "ddp/nn/cuda/kernels.cuh"

DDP_CUDA_OPTIMIZER(ddp::optim::sgd);
DDP_CUDA_OPTIMIZER(ddp::optim::adamw);
