#pragma once
// Marks a function that runs on the host and, when nvcc compiles it, on a CUDA device too: an
// optimizer's element rule is written once for both.
#if defined(__CUDACC__)
#define DDP_HOST_DEVICE __host__ __device__
#else
#define DDP_HOST_DEVICE
#endif
