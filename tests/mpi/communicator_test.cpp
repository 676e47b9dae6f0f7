// The communicator conformance suite (the one the in-process backend passes) on MPI processes.
#include <doctest/doctest.h>

#include <mpi.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "../conformance/communicator_suite.hpp"
#include "mpi/world.hpp"

namespace mpi_communicator_test {

TEST_CASE("mpi all_reduce: every dtype, op, size, in and out of place") { conformance::all_reduce_cases(mpi_test::comm()); }
TEST_CASE("mpi broadcast: every dtype, size and root") { conformance::broadcast_cases(mpi_test::comm()); }
TEST_CASE("mpi all_gather: every dtype and size, in and out of place") { conformance::all_gather_cases(mpi_test::comm()); }
TEST_CASE("mpi reduce_scatter: every dtype, op and size, in and out of place") { conformance::reduce_scatter_cases(mpi_test::comm()); }
TEST_CASE("mpi avg: ranks at the largest power of two average to it, not inf") {
  conformance::avg_overflow_cases(mpi_test::comm());
}
TEST_CASE("mpi f16 and bf16: reduced by ddp's MPI operations, moved as bytes") { conformance::half_cases(mpi_test::comm()); }
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
TEST_CASE("mpi local rank numbers the ranks of each host") {
  // The local rank picks a rank's GPU: it must count the ranks before it on its own host only.
  // Under tests/mpi/two_hosts.sh the ranks sit on two hosts (DDP_TEST_HOSTS=2).
  const int size = mpi_test::comm().size();
  std::vector<char> names(static_cast<std::size_t>(size) * MPI_MAX_PROCESSOR_NAME, '\0');
  int length = 0;
  char mine[MPI_MAX_PROCESSOR_NAME] = {};
  MPI_Get_processor_name(mine, &length);
  MPI_Allgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
  const auto host = [&](int r) { return std::string(names.data() + static_cast<std::ptrdiff_t>(r) * MPI_MAX_PROCESSOR_NAME); };
  int before_on_my_host = 0;
  std::set<std::string> hosts;
  for (int r = 0; r < size; ++r) {
    hosts.insert(host(r));
    if (r < mpi_test::comm().rank() && host(r) == host(mpi_test::comm().rank())) ++before_on_my_host;
  }
  CAPTURE(host(mpi_test::comm().rank()));
  CHECK(mpi_test::comm().local_rank() == before_on_my_host);
  const char* expected = std::getenv("DDP_TEST_HOSTS");
  CHECK(hosts.size() == static_cast<std::size_t>(expected ? std::atoi(expected) : 1));
}

}  // namespace mpi_communicator_test
