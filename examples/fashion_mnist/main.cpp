// Data-parallel training of an MLP on Fashion-MNIST: the main example of ddp.
//   fashion_mnist --ranks 2 --epochs 8 --batch 64 --lr 0.1 --buffer-sync broadcast_once_per_step
#include <CLI/CLI.hpp>

#include <cstdio>

#include <chrono>
#include <stdexcept>
#include <string>

#include "ddp/core/error.hpp"
#include "ddp/nn/blas.hpp"
#if DDP_EXAMPLE_WITH_MPI
#include "ddp/mpi/environment.hpp"
#endif
#include "run.hpp"

namespace {

#if DDP_EXAMPLE_WITH_TORCH
using platform = fmnist::torch_platform;
constexpr const char* model_description = "a small CNN written in libtorch (two conv + batch norm + pool blocks, "
                                          "dropout, two linear layers)";
#elif DDP_EXAMPLE_WITH_CUDA
using platform = fmnist::gpu_platform;
constexpr const char* model_description = "a 784-512-512-10 MLP (batch_norm after each hidden layer)";
#else
using platform = fmnist::host_platform;
constexpr const char* model_description = "a 784-512-512-10 MLP (batch_norm after each hidden layer)";
#endif

constexpr const char* gpu_build_hint =
    "--device cuda is in fashion_mnist_gpu (built when the CUDA toolkit is found: cmake --build build --target "
    "fashion_mnist_gpu)";

// Accepts exactly `value`; anything else fails with `elsewhere`, which says where it is served.
CLI::Validator only(std::string value, std::string elsewhere) {
  return CLI::Validator(
      [value, elsewhere](std::string& given) {
        return given == value ? std::string() : "'" + given + "' is not served by this binary: " + elsewhere;
      },
      value);
}

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
  app.add_option("--reduction", c.reduction,
                 "Reduction policy: plain (the ranks' gradients averaged in floating point), or invariant (each "
                 "step's global batch is 8 virtual shards whose gradients are summed exactly: the same bits at "
                 "1 to 8 ranks; keep --global-batch fixed, a multiple of 8)")
      ->check(CLI::IsMember({"plain", "invariant"}))
      ->capture_default_str();
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
  app.add_option("--update", c.update,
                 "Update policy: every rank updates every parameter (replicated), or each updates 1/N of them and "
                 "the ranks gather the result (sharded), also keeping only 1/N of the gradients (sharded_gradients), "
                 "and of the parameters, gathered layer by layer (fully_sharded)")
      ->check(CLI::IsMember({"replicated", "sharded", "sharded_gradients", "fully_sharded"}))->capture_default_str();
  app.add_flag("--overlap-optimizer", c.overlap_optimizer,
               "update each gradient bucket as soon as its reduction completes, while later buckets still reduce "
               "(the same bits)");
  app.add_option("--hook", c.hook,
                 "Communication hook: gradients travel in f32 (none), or divided by the world size and cast to 16 "
                 "bits (bf16, fp16), half the bytes; or as rank-4 factors of each weight matrix with error "
                 "feedback (powersgd, after --hook-start plain steps)")
      ->check(CLI::IsMember({"none", "bf16", "fp16", "powersgd"}))->capture_default_str();
  app.add_option("--hook-start", c.hook_start, "powersgd: optimizer steps reduced plainly before compression starts")
      ->capture_default_str();
#if !DDP_EXAMPLE_WITH_TORCH
  app.add_option("--precision", c.precision,
                 "the model's parameters: f32, or bf16 / f16 (the model holds 16 bits, the trainer an f32 master "
                 "copy that the optimizer updates; with --hook none gradients are reduced in f32)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))->capture_default_str();
#endif
  app.add_option("--data-dir", c.data_dir, "directory with the four Fashion-MNIST .gz files")->capture_default_str();
  // Each binary runs one platform; a flag value that belongs to another binary says which one.
#if DDP_EXAMPLE_WITH_TORCH
  app.add_option("--backend", c.backend,
                 "communicator: inproc (ranks as threads of this process); started by mpirun/srun, the MPI "
                 "processes are the ranks (mpi)")
      ->check(CLI::IsMember({"inproc", "mpi"}))
      ->capture_default_str();
  app.add_option("--device", c.device, "device")
      ->check(only("cpu", "this build trains on the CPU (Debian's libtorch is CPU-only; docs/torch.md)"))
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
      ->check(only("cuda", "--device cpu is in fashion_mnist and fashion_mnist_mpi"))
      ->capture_default_str();
#elif DDP_EXAMPLE_WITH_MPI
  c.backend = "mpi";
  app.add_option("--backend", c.backend, "communicator: mpi, one rank per process under mpirun")
      ->check(only("mpi", "in-process ranks are in fashion_mnist; nccl is in fashion_mnist_gpu"))
      ->capture_default_str();
  app.add_option("--device", c.device, "device")->check(only("cpu", gpu_build_hint))->capture_default_str();
#else
  app.add_option("--backend", c.backend, "communicator: inproc, ranks as threads of this process")
      ->check(only("inproc", "--backend mpi is in fashion_mnist_mpi (built when OpenMPI is found); --backend nccl "
                             "is in fashion_mnist_gpu"))
      ->capture_default_str();
  app.add_option("--device", c.device, "device")->check(only("cpu", gpu_build_hint))->capture_default_str();
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
      const auto world = ddp::mpi::environment::world();
      if (app.count("--ranks") && c.ranks != world.size)
        throw std::invalid_argument("under mpirun the ranks are the MPI processes: --ranks " + std::to_string(c.ranks) +
                                    " but mpirun started " + std::to_string(world.size) + " (set -np instead)");
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
