// One rank's faults on MPI processes, each run under mpirun -np 3; the first argument picks it:
//
//   failure  rank 1 throws inside a training step while the others wait in a collective: the job
//            ends (no hang) and the output names rank 1 and the failure.
//   missing  rank 1 never joins the second collective: the watchdog ends the job within its
//            timeout, naming the collective, its sequence number and rank 1 as the rank that has
//            not arrived (its watchdog answers the roll call while its main thread sleeps).
//   killed   rank 1 is killed (SIGKILL: no handler, no message of its own) in the middle of its
//            third step, while the others wait for its gradients: the job ends (no hang) and the
//            launcher names the lost rank.
//   asleep <folder>  (run by tests/mpi/rank_asleep_why.sh, with DDP_FLIGHT_RECORDER_DIR set) rank 1
//            falls asleep inside step 1 until the file <folder>/wake appears (at most 30 s); the
//            others wait in step 1's gradient reduction. Each process writes its pid to
//            <folder>/pid.<rank> once its flight recorder listens for SIGUSR1, and rank 1 writes
//            <folder>/asleep as it falls asleep.
//
// One program for the four, so that the trainer type they share is compiled once.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>

#include "ddp/comm/collectives.hpp"
#include "ddp/ddp.hpp"
#include "ddp/host/device.hpp"
#include "ddp/mpi/communicator.hpp"
#include "trainer/test_model.hpp"

namespace {

namespace fs = std::filesystem;
using trainer_type = ddp::trainer<test::branchy, ddp::use_communicator<ddp::mpi::communicator>>;

void step(trainer_type& trainer, int s, int rank, const auto& before_backward) {
  const auto b = test::make_batch(6, 100 + static_cast<std::uint64_t>(s * 3 + rank));
  trainer.step([&](auto& r) {
    auto out = r.forward(b.x);
    before_backward();
    r.backward(ddp::nn::softmax_cross_entropy(out, b.y).grad);
  });
}

int missing(ddp::mpi::communicator& comm) {
  std::vector<float> v(16, 1.0f);
  ddp::comm::all_reduce(comm, std::span<float>(v), ddp::reduce_op::sum);
  if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(30));
  ddp::comm::all_reduce(comm, std::span<float>(v), ddp::reduce_op::sum);
  return 0;
}

int asleep(ddp::mpi::communicator& comm, trainer_type& trainer, const fs::path& folder) {
  std::ofstream(folder / ("pid." + std::to_string(comm.rank()))) << ::getpid() << "\n";
  for (int s = 0; s < 2; ++s)
    step(trainer, s, comm.rank(), [&] {
      if (s != 1 || comm.rank() != 1) return;
      std::ofstream(folder / "asleep") << "step 1\n";
      for (int i = 0; i < 3000 && !fs::exists(folder / "wake"); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ddp::mpi::environment env(&argc, &argv);
  const std::string_view mode = argc >= 2 ? argv[1] : "";
  const bool known = mode == "failure" || mode == "missing" || mode == "killed" || mode == "asleep";
  if (!known || (mode == "asleep") != (argc == 3) || (mode == "asleep" && !std::getenv("DDP_FLIGHT_RECORDER_DIR"))) {
    std::fprintf(stderr,
                 "usage: mpirun -np 3 %s failure|missing|killed\n"
                 "       DDP_FLIGHT_RECORDER_DIR=<dumps> mpirun -np 3 %s asleep <folder>\n",
                 argv[0], argv[0]);
    return 2;
  }
  using namespace std::chrono_literals;
  const auto timeout = mode == "missing" ? std::chrono::milliseconds(1500) : mode == "asleep" ? 60s : 300s;
  ddp::mpi::communicator comm(MPI_COMM_WORLD, {.timeout = timeout});
  if (mode == "missing") return missing(comm);
  test::branchy model(5);
  ddp::host::device dev;
  trainer_type trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.05f});
  if (mode == "asleep") return asleep(comm, trainer, argv[2]);
  const bool failure = mode == "failure";
  for (int s = 0; s < (failure ? 1 : 100); ++s)
    step(trainer, s, comm.rank(), [&] {
      if (comm.rank() != 1) return;
      if (failure) throw std::runtime_error("loss is NaN on rank 1");
      if (s == 2) std::raise(SIGKILL);
    });
  return 0;
}
