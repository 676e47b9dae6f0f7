#pragma once
// MPI's lifetime, and where this process sits in the job: rank, world size and local rank from
// the launcher (mpirun's OMPI_COMM_WORLD_*, Slurm's SLURM_* under srun).
#include <mpi.h>

#include <cstdlib>
#include <exception>
#include <optional>
#include <string>

#include "ddp/core/placement.hpp"
#include "ddp/mpi/check.hpp"
#include "ddp/comm/run_agent.hpp"

namespace ddp::mpi {

using ddp::placement;
using ddp::placement_from_environment;

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
    run::agent::current();  // under ddp-run: reports to it from now on
  }
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;
  // Under ddp-run, a process that an exception ends tells ddp-run (its peers may wait for it in a
  // collective) and ends without MPI_Finalize, which would wait for them (comm/run_agent.hpp).
  ~environment() {
    if (auto* agent = run::agent::current()) {
      if (std::uncaught_exceptions() > 0) agent->report_exit_by_exception();
      if (agent->failing()) return;
      agent->finished();
    }
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
