#pragma once
// Where this process sits in a job of processes: rank, world size and local rank as the launcher
// tells them (mpirun's OMPI_COMM_WORLD_*, Slurm's SLURM_* under srun, PMI's), read before any
// communicator exists (or without one).
#include <cstdlib>
#include <optional>
#include <string>

namespace ddp {

struct placement {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // index of this process on its node: binds the GPU
  std::string launcher;
};

inline std::optional<int> env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::atoi(v);
}

// What the launcher says about this process, before MPI starts (or without MPI at all).
inline std::optional<placement> placement_from_environment() {
  if (auto r = env_int("OMPI_COMM_WORLD_RANK"))
    return placement{*r, env_int("OMPI_COMM_WORLD_SIZE").value_or(1), env_int("OMPI_COMM_WORLD_LOCAL_RANK").value_or(0),
                     "mpirun (OpenMPI)"};
  if (auto r = env_int("SLURM_PROCID"))
    return placement{*r, env_int("SLURM_NTASKS").value_or(1), env_int("SLURM_LOCALID").value_or(0), "srun (Slurm)"};
  if (auto r = env_int("PMI_RANK"))
    return placement{*r, env_int("PMI_SIZE").value_or(1), env_int("MPI_LOCALRANKID").value_or(0), "PMI"};
  return std::nullopt;
}

}  // namespace ddp
