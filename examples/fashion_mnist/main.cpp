// Data-parallel training of an MLP on Fashion-MNIST: the main example of ddp.
//   fashion_mnist --ranks 2 --epochs 8 --batch 64 --lr 0.1 --buffer-sync broadcast_once_per_step
#include <CLI/CLI.hpp>

#include <cstdio>

#include "train.hpp"

namespace {
void print_banner(const fmnist::config& c) {
  std::printf("ddp Fashion-MNIST: %d rank(s) x batch %zu on %s, %d epoch(s), %s lr %.3g (%s), seed %llu\n", c.ranks,
              c.batch, c.backend.c_str(), c.epochs, c.optimizer.c_str(), c.lr, c.schedule.c_str(),
              static_cast<unsigned long long>(c.seed));
}
}  // namespace

int main(int argc, char** argv) {
  fmnist::config c;
  CLI::App app{"ddp example: data-parallel training of a 784-512-512-10 MLP (batch_norm after each hidden "
               "layer) on Fashion-MNIST"};
  app.add_option("--ranks", c.ranks, "number of ranks (in-process threads)")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--epochs", c.epochs, "passes over the 60,000 training images")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--batch", c.batch, "batch size per rank (global batch = ranks x batch)")->check(CLI::Range(2, 60000))->capture_default_str();
  app.add_option("--lr", c.lr, "peak learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum")->check(CLI::Range(0.0, 0.999))->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay, "weight decay (coupled for sgd, decoupled for adamw)")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--schedule", c.schedule, "learning-rate schedule")->check(CLI::IsMember({"cosine", "constant"}))->capture_default_str();
  app.add_option("--seed", c.seed, "seed of the initial weights and the data order")->capture_default_str();
  app.add_option("--buffer-sync", c.buffer_sync, "BufferSync policy")
      ->check(CLI::IsMember({"none", "broadcast_each_forward", "broadcast_once_per_step", "average_once_per_step"}))
      ->capture_default_str();
  app.add_option("--unused-params", c.unused_params, "UnusedParamDetection policy")
      ->check(CLI::IsMember({"forbid", "detect_each_step", "static_graph"}))->capture_default_str();
  app.add_option("--sampler", c.sampler, "Sampler policy")
      ->check(CLI::IsMember({"distributed", "distributed_drop", "distributed_in_order", "contiguous"}))->capture_default_str();
  app.add_option("--optimizer", c.optimizer, "optimizer")->check(CLI::IsMember({"sgd", "adamw"}))->capture_default_str();
  app.add_option("--data-dir", c.data_dir, "directory with the four Fashion-MNIST .gz files")->capture_default_str();
#if DDP_EXAMPLE_WITH_MPI
  c.backend = "mpi";
  app.add_option("--backend", c.backend,
                 "communicator: mpi, one rank per process under mpirun (in-process ranks are in fashion_mnist)")
      ->check(CLI::IsMember({"mpi"}))->capture_default_str();
#else
  app.add_option("--backend", c.backend,
                 "communicator (--backend mpi is in fashion_mnist_mpi, built when OpenMPI is found)")
      ->check(CLI::IsMember({"inproc"}))->capture_default_str();
#endif
  app.add_option("--device", c.device, "device")->check(CLI::IsMember({"cpu"}))->capture_default_str();
  app.add_flag("!--no-progress", c.progress, "no per-step progress line");
  CLI11_PARSE(app, argc, argv);

  fmnist::report r;
  const auto start = std::chrono::steady_clock::now();
  auto run = [&]<class Comm>() {
    if (c.buffer_sync == "none") fmnist::run_with_sync<ddp::buffer_sync::none, Comm>(c, r);
    else if (c.buffer_sync == "broadcast_each_forward") fmnist::run_with_sync<ddp::buffer_sync::broadcast_each_forward, Comm>(c, r);
    else if (c.buffer_sync == "average_once_per_step") fmnist::run_with_sync<ddp::buffer_sync::average_once_per_step, Comm>(c, r);
    else fmnist::run_with_sync<ddp::buffer_sync::broadcast_once_per_step, Comm>(c, r);
  };
  bool lead = true;
  try {
#if DDP_EXAMPLE_WITH_MPI
    {
      ddp::mpi::environment env(&argc, &argv);
      const auto world = ddp::mpi::environment::world();
      if (app.count("--ranks") && c.ranks != world.size)
        throw std::invalid_argument("with --backend mpi the ranks are the MPI processes: --ranks " + std::to_string(c.ranks) +
                                    " but mpirun started " + std::to_string(world.size) + " (set -np instead)");
      c.ranks = world.size;
      lead = world.rank == 0;
      if (lead) print_banner(c);
      run.template operator()<ddp::mpi::communicator>();
    }
#else
    print_banner(c);
    run.template operator()<ddp::inproc::communicator>();
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  if (!lead) return 0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto& last = r.epochs.back();
  std::printf("\nsummary\n  test accuracy   %.2f%% after %d epoch(s)\n  training time   %.1f s (wall %.1f s with data "
              "loading)\n  throughput      %.0f samples/s over %d rank(s)\n  policies        %s\n",
              100 * last.test_accuracy, last.epoch, r.train_seconds, wall, r.samples_per_second, c.ranks,
              r.policies.c_str());
  return 0;
}
