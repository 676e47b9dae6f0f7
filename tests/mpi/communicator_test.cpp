// The communicator conformance suite (the one the in-process backend passes) on MPI processes.
#include <doctest/doctest.h>

#include <mpi.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include <filesystem>

#include "../conformance/communicator_suite.hpp"
#include "ddp/comm/checked_communicator.hpp"
#include "mpi/world.hpp"
#include "support/mismatch.hpp"
#include "why/verdict.hpp"

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

TEST_CASE("mpi checking mode: each injected mismatch is the same error on every rank, and ddp-why names it from the dumps") {
  namespace fs = std::filesystem;
  auto& world = mpi_test::comm();
  const int odd = world.size() - 1;  // the last rank issues something else at #2
  std::int64_t id = ::getpid();
  id = ddp::comm::all_reduce_value(world, id, ddp::reduce_op::max);
  for (const auto& inj : mismatch::injections) {
    CAPTURE(inj.kind);
    const fs::path dir = fs::temp_directory_path() / ("ddp_flight_mpi_" + std::to_string(id) + "_" + inj.kind +
                                                      std::to_string(static_cast<int>(inj.what)));
    if (world.rank() == 0) {
      fs::remove_all(dir);
      fs::create_directories(dir);
    }
    ddp::comm::barrier(world);
    ddp::mpi::options opts;
    opts.timeout = std::chrono::seconds(30);
    opts.recorder = ddp::comm::recorder_options{.entries = 64, .dump_dir = dir.string(), .dump_on_signal = false};
    std::string error;
    {
      ddp::mpi::communicator inner(MPI_COMM_WORLD, opts);
      ddp::comm::checked_communicator comm(inner);
      try {
        mismatch::issue_steps(comm, inj.what, odd);
      } catch (const ddp::error& e) {
        error = e.what();
      }
      ddp::comm::barrier(inner);  // the communicator still works: nothing mismatched reached MPI
    }
    CAPTURE(error);
    CHECK(error.find("ranks disagree on collective #2") != std::string::npos);
    CHECK(error.find("rank " + std::to_string(odd) + " issued " + inj.odd_issue) != std::string::npos);
    CHECK(error.find("differs from the others: rank " + std::to_string(odd) + ")") != std::string::npos);
    if (world.rank() == 0) {
      const auto v = ddp::why::judge_folder(dir, "mpi");
      INFO(v.text);
      CHECK(v.status == ddp::why::differ);
      CHECK(v.sequence == std::optional<std::uint64_t>(2));
      CHECK(v.kind == inj.kind);
      REQUIRE(v.sides.size() == 2);
      CHECK(v.sides[1].ranks == std::vector<int>{odd});
      CHECK(v.sides[1].call->describe().find(inj.odd_issue) != std::string::npos);
      CHECK(v.sides[0].call->tag() == "step 1, bucket 1, gradients");
      if (world.size() > 2) CHECK(v.odd == std::vector<int>{odd});
      fs::remove_all(dir);
    }
    ddp::comm::barrier(world);
  }
}

}  // namespace mpi_communicator_test
