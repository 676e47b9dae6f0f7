#pragma once
// MPI's lifetime, and where this process sits in the job: rank, world size and local rank from
// the launcher (mpirun's OMPI_COMM_WORLD_*, Slurm's SLURM_* under srun).
#include <mpi.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "ddp/mpi/check.hpp"

namespace ddp::mpi {

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

// Starts MPI for the process (once) with the thread support the communicators need: each
// communicator calls MPI from its own progress thread, one call at a time per process.
class environment {
 public:
  environment(int* argc = nullptr, char*** argv = nullptr) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = 0;
    check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "init", -1);
    owner_ = true;
    if (provided < MPI_THREAD_SERIALIZED)
      throw error("mpi", "init", -1,
                  "this MPI library provides thread level " + std::to_string(provided) +
                      ", but ddp calls MPI from progress threads and needs MPI_THREAD_SERIALIZED or more");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;
  ~environment() {
    if (owner_) MPI_Finalize();
  }

  static placement world() {
    placement p;
    MPI_Comm_rank(MPI_COMM_WORLD, &p.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p.size);
    const auto env = placement_from_environment();
    p.local_rank = env ? env->local_rank : 0;
    p.launcher = env ? env->launcher : "none (a single process)";
    return p;
  }

 private:
  bool owner_ = false;
};

}  // namespace ddp::mpi
