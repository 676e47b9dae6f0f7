// Run under mpirun -np 3: rank 1 never joins the second collective. Expected: the watchdog ends the
// job within the timeout, naming the collective, its sequence number, and rank 1 as the rank
// that has not arrived (its watchdog answers the roll call while its main thread sleeps).
#include <chrono>
#include <thread>

#include "ddp/comm/collectives.hpp"
#include "ddp/mpi/communicator.hpp"

int main(int argc, char** argv) {
  ddp::mpi::environment env(&argc, &argv);
  ddp::mpi::communicator comm(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds(1500)});
  std::vector<float> v(16, 1.0f);
  ddp::comm::all_reduce(comm, std::span<float>(v), ddp::reduce_op::sum);
  if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(30));
  ddp::comm::all_reduce(comm, std::span<float>(v), ddp::reduce_op::sum);
  return 0;
}
