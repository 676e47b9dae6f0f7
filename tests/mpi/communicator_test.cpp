// The communicator conformance suite (the one the in-process backend passes) on MPI processes.
#include <doctest/doctest.h>

#include <cstdlib>

#include "../conformance/communicator_suite.hpp"
#include "mpi/world.hpp"

TEST_CASE("mpi all_reduce: every dtype, op, size, in and out of place") { conformance::all_reduce_cases(mpi_test::comm()); }
TEST_CASE("mpi broadcast: every dtype, size and root") { conformance::broadcast_cases(mpi_test::comm()); }
TEST_CASE("mpi all_gather: every dtype and size, in and out of place") { conformance::all_gather_cases(mpi_test::comm()); }
TEST_CASE("mpi reduce_scatter: every dtype, op and size, in and out of place") { conformance::reduce_scatter_cases(mpi_test::comm()); }
TEST_CASE("mpi avg: ranks at the largest power of two average to it, not inf") {
  conformance::avg_overflow_cases(mpi_test::comm());
}
TEST_CASE("mpi asynchronous collectives complete in issue order") { conformance::async_cases(mpi_test::comm()); }
TEST_CASE("mpi all_reduce is bitwise identical on every rank and in every run") {
  auto first = conformance::determinism_case(mpi_test::comm());
  auto second = conformance::determinism_case(mpi_test::comm());
  CHECK(first == second);
}
TEST_CASE("mpi placement comes from the launcher") {
  auto p = ddp::mpi::placement_from_environment();
  REQUIRE(p.has_value());
  CHECK(p->rank == mpi_test::comm().rank());
  CHECK(p->size == mpi_test::comm().size());
  // Under mpirun its OMPI_COMM_WORLD_* variables; under srun (scripts/slurm-one-node.sh) Slurm's.
  const bool srun = std::getenv("OMPI_COMM_WORLD_RANK") == nullptr && std::getenv("SLURM_PROCID") != nullptr;
  CHECK(p->launcher == (srun ? "srun (Slurm)" : "mpirun (OpenMPI)"));
  if (srun) {
    CHECK(p->rank == std::atoi(std::getenv("SLURM_PROCID")));
    CHECK(p->size == std::atoi(std::getenv("SLURM_NTASKS")));
    CHECK(p->local_rank == std::atoi(std::getenv("SLURM_LOCALID")));
  }
  CHECK(mpi_test::comm().local_rank() == p->local_rank);
}
