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

namespace char_gpt {

// Trains with the policies `c` names: in-process ranks, or this process as one rank under mpirun.
template <class Launcher>
void run_with(const config& c, report& out);

#if DDP_EXAMPLE_WITH_MPI
extern template void run_with<ddp::mpi::communicator>(const config&, report&);
#else
extern template void run_with<ddp::inproc::communicator>(const config&, report&);
#endif

}  // namespace char_gpt
