#pragma once
// What main.cpp needs of the training runs, which train.cpp defines: kept free of the trainer,
// so the command line's translation unit compiles in a few seconds.
#include "config.hpp"

namespace ddp::inproc {
class communicator;
}
namespace ddp::mpi {
class communicator;
}

namespace fmnist {

struct host_platform;
struct gpu_platform;
struct torch_platform;

// Trains with the policies `c` names. The launcher starts the ranks (in-process threads, or this
// process under mpirun); the platform picks device, model and communicator for each rank.
template <class Launcher, class Platform>
void run_with(const config& c, report& out);

#if DDP_EXAMPLE_WITH_TORCH  // in-process, or under mpirun when started by it
extern template void run_with<ddp::inproc::communicator, torch_platform>(const config&, report&);
#if DDP_EXAMPLE_WITH_MPI
extern template void run_with<ddp::mpi::communicator, torch_platform>(const config&, report&);
#endif
#elif DDP_EXAMPLE_WITH_CUDA
extern template void run_with<ddp::inproc::communicator, gpu_platform>(const config&, report&);
#if DDP_EXAMPLE_WITH_MPI
extern template void run_with<ddp::mpi::communicator, gpu_platform>(const config&, report&);
#endif
#elif DDP_EXAMPLE_WITH_MPI  // under mpirun only
extern template void run_with<ddp::mpi::communicator, host_platform>(const config&, report&);
#else
extern template void run_with<ddp::inproc::communicator, host_platform>(const config&, report&);
#endif

}  // namespace fmnist
