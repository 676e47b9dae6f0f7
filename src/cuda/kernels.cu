// The one nvcc translation unit of ddp::cuda: the device's kernels and the reference layers'.
// CMake adds it to every target that links ddp::cuda (built once in ddp's own tree).
#include "ddp/cuda/kernels.cuh"
#include "ddp/cuda/nn/kernels.cuh"
