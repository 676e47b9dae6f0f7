// Run under mpirun -np 3 by tests/mpi/rank_asleep_why.sh, with DDP_FLIGHT_RECORDER_DIR set and a
// folder of its own as the argument: rank 1 falls asleep inside step 1 until the file <folder>/wake
// appears (at most 30 s); the others wait in step 1's gradient reduction. Each process writes its
// pid to <folder>/pid.<rank> once its flight recorder listens for SIGUSR1, and rank 1 writes
// <folder>/asleep as it falls asleep. The script pokes the job with SIGUSR1 (mpirun passes it to
// every process), reads the dumps with ddp-why, and wakes rank 1: the job then ends normally.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "ddp/ddp.hpp"
#include "ddp/mpi/communicator.hpp"
#include "trainer/test_model.hpp"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  ddp::mpi::environment env(&argc, &argv);
  if (argc != 2 || !std::getenv("DDP_FLIGHT_RECORDER_DIR")) {
    std::fprintf(stderr, "usage: DDP_FLIGHT_RECORDER_DIR=<dumps> mpirun -np 3 %s <folder>\n", argv[0]);
    return 2;
  }
  const fs::path folder = argv[1];
  ddp::mpi::communicator comm(MPI_COMM_WORLD, {.timeout = std::chrono::seconds(60)});
  test::branchy model(5);
  ddp::host::device dev;
  ddp::trainer<test::branchy, ddp::use_communicator<ddp::mpi::communicator>> trainer(model, comm, dev,
                                                                                   ddp::optim::sgd{.lr = 0.05f});
  std::ofstream(folder / ("pid." + std::to_string(comm.rank()))) << ::getpid() << "\n";
  for (int s = 0; s < 2; ++s) {
    const auto b = test::make_batch(6, 100 + static_cast<std::uint64_t>(s * 3 + comm.rank()));
    trainer.step([&](auto& r) {
      if (s == 1 && comm.rank() == 1) {
        std::ofstream(folder / "asleep") << "step 1\n";
        for (int i = 0; i < 3000 && !fs::exists(folder / "wake"); ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad);
    });
  }
  return 0;
}
