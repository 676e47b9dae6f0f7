#pragma once
// Under mpirun (or srun) the MPI processes are the ranks: the examples' --ranks, when given, must
// agree with the job's size. Call after ddp::mpi::environment has started MPI.
#include <stdexcept>
#include <string>

#include "ddp/mpi/environment.hpp"

namespace examples {

// This process's place in the job; `ranks` is --ranks, `ranks_given` whether the command line set it.
inline ddp::placement mpi_world(bool ranks_given, int ranks) {
  const auto world = ddp::mpi::environment::world();
  if (ranks_given && ranks != world.size)
    throw std::invalid_argument("under mpirun the ranks are the MPI processes: --ranks " + std::to_string(ranks) +
                                " but mpirun started " + std::to_string(world.size) + " (set -np instead)");
  return world;
}

}  // namespace examples
