// The example's training runs, every policy combination, in one translation unit beside main.cpp.
#include "train.hpp"

namespace char_gpt {
#if DDP_EXAMPLE_WITH_MPI
template void run_with<ddp::mpi::communicator>(const config&, report&);
#else
template void run_with<ddp::inproc::communicator>(const config&, report&);
#endif
}  // namespace char_gpt
