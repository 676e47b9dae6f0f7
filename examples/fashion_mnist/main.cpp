// Data-parallel training of an MLP on Fashion-MNIST: the main example of ddp.
//   fashion_mnist --ranks 2 --epochs 8 --batch 64 --lr 0.1 --buffer-sync broadcast_once_per_step
#include <CLI/CLI.hpp>

#include <cstdio>

#include <chrono>
#include <stdexcept>
#include <string>

#include "../common/policy_cli.hpp"
#include "ddp/core/error.hpp"
#include "ddp/nn/blas.hpp"
#if DDP_EXAMPLE_WITH_MPI
#include "../common/mpi_world.hpp"
#include "ddp/mpi/environment.hpp"
#endif
#include "run.hpp"

namespace {

#if DDP_EXAMPLE_WITH_TORCH
using platform = fmnist::torch_platform;
constexpr const char* model_description = "a small CNN written in libtorch (two conv + batch norm + pool blocks, "
                                          "dropout, two linear layers)";
constexpr bool offers_precision = false;  // libtorch's modules keep their own dtype
#elif DDP_EXAMPLE_WITH_CUDA
using platform = fmnist::gpu_platform;
constexpr const char* model_description = "a 784-512-512-10 MLP (batch_norm after each hidden layer)";
#else
using platform = fmnist::host_platform;
constexpr const char* model_description = "a 784-512-512-10 MLP (batch_norm after each hidden layer)";
#endif
#if !DDP_EXAMPLE_WITH_TORCH
constexpr bool offers_precision = true;  // --precision: the reference layers hold bf16 / f16 parameters
#endif

constexpr const char* gpu_build_hint =
    "--device cuda is in fashion_mnist_gpu (built when the CUDA toolkit is found: cmake --build build --target "
    "fashion_mnist_gpu)";

void print_banner(const fmnist::config& c) {
  std::printf("ddp Fashion-MNIST: %d rank(s) x batch %zu on %s (%s), %d epoch(s), %s lr %.3g (%s), seed %llu\n",
              c.ranks, c.batch, c.backend.c_str(), c.device.c_str(), c.epochs, c.optimizer.c_str(), c.lr,
              c.schedule.c_str(), static_cast<unsigned long long>(c.seed));
#if !DDP_EXAMPLE_WITH_CUDA
  if (const auto w = ddp::nn::blas::kernel_warning()) {
    std::fflush(stdout);
    std::fprintf(stderr, "warning: %s\n", w->c_str());
  }
#endif
}

}  // namespace

int main(int argc, char** argv) {
  fmnist::config c;
  CLI::App app{std::string("ddp example: data-parallel training of ") + model_description + " on Fashion-MNIST"};
  app.add_option("--ranks", c.ranks, "number of ranks (in-process threads; with --backend nccl one GPU each)")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--epochs", c.epochs, "passes over the 60,000 training images")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--batch", c.batch, "batch size per rank (global batch = ranks x batch)")->check(CLI::Range(2, 60000))->capture_default_str();
  app.add_option("--global-batch", c.global_batch,
                 "samples per step over all ranks, instead of --batch (default: ranks x batch)")
      ->check(CLI::Range(2, 60000));
  app.add_option("--lr", c.lr, "peak learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum")->check(CLI::Range(0.0, 0.999))->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay, "weight decay (coupled for sgd, decoupled for adamw)")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--schedule", c.schedule, "learning-rate schedule")->check(CLI::IsMember({"cosine", "constant"}))->capture_default_str();
  app.add_option("--seed", c.seed, "seed of the initial weights and the data order")->capture_default_str();
  examples::add_policy_options(app, c, offers_precision);
  app.add_option("--data-dir", c.data_dir, "directory with the four Fashion-MNIST .gz files")->capture_default_str();
  // Each binary runs one platform; a flag value that belongs to another binary says which one.
#if DDP_EXAMPLE_WITH_TORCH
  app.add_option("--backend", c.backend,
                 "communicator: inproc (ranks as threads of this process); started by mpirun/srun, the MPI "
                 "processes are the ranks (mpi)")
      ->check(CLI::IsMember({"inproc", "mpi"}))
      ->capture_default_str();
  app.add_option("--device", c.device, "device")
      ->check(examples::only("cpu", "this build trains on the CPU (Debian's libtorch is CPU-only; docs/torch.md)"))
      ->capture_default_str();
#elif DDP_EXAMPLE_WITH_CUDA
  c.backend = "nccl";
  c.device = "cuda";
  app.add_option("--backend", c.backend,
                 "communicator: nccl, one GPU per rank (in-process threads, or one process per GPU under "
                 "mpirun/srun); staged, in-process ranks sharing the GPUs (rank r on GPU r mod count; NCCL refuses "
                 "two ranks on one GPU), their collectives through host memory")
      ->check([](const std::string& v) {
        return v == "nccl" || v == "staged"
                   ? std::string()
                   : "'" + v + "': this binary's backends are nccl and staged; the host backends (inproc, mpi) are in "
                     "fashion_mnist and fashion_mnist_mpi";
      })
      ->capture_default_str();
  app.add_option("--device", c.device, "device")
      ->check(examples::only("cuda", "--device cpu is in fashion_mnist and fashion_mnist_mpi"))
      ->capture_default_str();
#elif DDP_EXAMPLE_WITH_MPI
  c.backend = "mpi";
  app.add_option("--backend", c.backend, "communicator: mpi, one rank per process under mpirun")
      ->check(examples::only("mpi", "in-process ranks are in fashion_mnist; nccl is in fashion_mnist_gpu"))
      ->capture_default_str();
  app.add_option("--device", c.device, "device")->check(examples::only("cpu", gpu_build_hint))->capture_default_str();
#else
  app.add_option("--backend", c.backend, "communicator: inproc, ranks as threads of this process")
      ->check(examples::only("inproc", "--backend mpi is in fashion_mnist_mpi (built when OpenMPI is found); --backend nccl "
                             "is in fashion_mnist_gpu"))
      ->capture_default_str();
  app.add_option("--device", c.device, "device")->check(examples::only("cpu", gpu_build_hint))->capture_default_str();
#endif
  app.add_flag("!--no-progress", c.progress, "no per-step progress line");
  app.add_option("--checkpoint", c.checkpoint,
                 "directory for checkpoints: the run goes on from the one there (same flags), and saves one after "
                 "every epoch");
  app.add_option("--keep-last", c.keep_last, "--checkpoint keeps the last K checkpoints saved (trainer.load reads the "
                                             "last; trainer.load(dir, steps) any of them)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1000}))->capture_default_str();
  app.add_option("--trace", c.trace,
                 "write every step's phases (forward, backward, each bucket's reduction, update) of every rank as "
                 "Chrome trace JSON to this file: open it in ui.perfetto.dev or chrome://tracing");
  app.add_option("--prefetch", c.prefetch, "batches made ahead of the step on a thread per rank (0: none)")
      ->check(CLI::Range(0, 64))->capture_default_str();
  app.add_flag("--mapped", c.mapped,
               "memory-map uncompressed IDX files in --data-dir (train-images-idx3-ubyte, ...; gunzip -c each .gz "
               "one into a directory of your own) instead of reading the .gz files into memory");
  CLI11_PARSE(app, argc, argv);

  fmnist::report r;
  const auto start = std::chrono::steady_clock::now();
  auto run = [&]<class Launcher>() { fmnist::run_with<Launcher, platform>(c, r); };
  bool lead = true;
  try {
#if DDP_EXAMPLE_WITH_MPI
    // The GPU build runs under mpirun/srun when started by one, else as in-process threads.
#if DDP_EXAMPLE_WITH_CUDA || DDP_EXAMPLE_WITH_TORCH
    const bool under_mpi = ddp::mpi::placement_from_environment().has_value();
#else
    const bool under_mpi = true;
#endif
#else
    const bool under_mpi = false;
#endif
    if (c.backend == "mpi" && !under_mpi)
      throw std::invalid_argument("--backend mpi: start this binary with mpirun -np N (or srun); each MPI process "
                                  "is one rank");
    if (under_mpi) {
#if DDP_EXAMPLE_WITH_MPI
      ddp::mpi::environment env(&argc, &argv);
      const auto world = examples::mpi_world(app.count("--ranks") > 0, c.ranks);
      c.ranks = world.size;
      c.backend = "mpi";
      lead = world.rank == 0;
      if (lead) print_banner(c);
      run.template operator()<ddp::mpi::communicator>();
#endif
    } else {
#if !DDP_EXAMPLE_WITH_MPI || DDP_EXAMPLE_WITH_CUDA || DDP_EXAMPLE_WITH_TORCH  // the CPU MPI binary: none
      print_banner(c);
      run.template operator()<ddp::inproc::communicator>();
#endif
    }
  } catch (const std::exception& e) {
    // An error the ranks agreed on is the same in every MPI process: rank 0 prints it.
    if (lead || !dynamic_cast<const ddp::collective_error*>(&e)) std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  if (!lead) return 0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto& last = r.epochs.back();
  std::printf("\nsummary\n  test accuracy   %.2f%% after %d epoch(s)\n  training time   %.1f s (wall %.1f s with data "
              "loading)\n  throughput      %.0f samples/s over %d rank(s)\n  policies        %s\n  parameters      %s\n",
              100 * last.test_accuracy, last.epoch, r.train_seconds, wall, r.samples_per_second, c.ranks,
              r.policies.c_str(), c.precision == "f32" ? "f32" : (c.precision + " (f32 master copy)").c_str());
  const auto mib = [](std::size_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  std::printf("  memory          %.2f MiB on rank 0 between steps (parameters %.2f, gradients %.2f, optimizer state "
              "%.2f)",
              mib(r.memory.total()), mib(r.memory.parameters), mib(r.memory.gradients), mib(r.memory.optimizer_state));
  if (r.memory_peak) std::printf(", %.2f MiB at most in a step", mib(r.memory_peak));
  std::printf("\n");
  if (r.host_waits_per_step >= 0)
    std::printf("  host waits      %.2f per step (the host waited for the GPU: copies to the host, the loss, "
                "staged collectives)\n",
                r.host_waits_per_step);
  return 0;
}
