// The example's training runs, every policy combination, in one translation unit beside main.cpp.
#include "train.hpp"

namespace fmnist {
#if DDP_EXAMPLE_WITH_TORCH
template void run_with<ddp::inproc::communicator, torch_platform>(const config&, report&);
#if DDP_EXAMPLE_WITH_MPI
template void run_with<ddp::mpi::communicator, torch_platform>(const config&, report&);
#endif
#elif DDP_EXAMPLE_WITH_CUDA
template void run_with<ddp::inproc::communicator, gpu_platform>(const config&, report&);
#if DDP_EXAMPLE_WITH_MPI
template void run_with<ddp::mpi::communicator, gpu_platform>(const config&, report&);
#endif
#elif DDP_EXAMPLE_WITH_MPI  // under mpirun only
template void run_with<ddp::mpi::communicator, host_platform>(const config&, report&);
#else
template void run_with<ddp::inproc::communicator, host_platform>(const config&, report&);
#endif
}  // namespace fmnist
