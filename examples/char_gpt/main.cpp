// Data-parallel training of a character-level GPT (ddp::nn::gpt) on the text of Debian's
// `fortunes` package (docs/char_gpt.md).
//   char_gpt --ranks 2 --steps 2000 --batch 12 --lr 1e-3
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
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

void print_banner(const char_gpt::config& c) {
  // The batch as given: --global-batch over all ranks, or --batch per rank.
  const std::string batch = c.global_batch ? std::to_string(c.global_batch) + " sequences a step over " +
                                                 std::to_string(c.ranks) + " rank(s)"
                                           : std::to_string(c.ranks) + " rank(s) x " + std::to_string(c.batch) +
                                                 " sequences";
  std::printf("ddp char_gpt: %s of %zu bytes on %s, %zu steps, %s lr %.3g (warm-up %zu, "
              "cosine to %.3g), %zu layers, %zu heads, width %zu, seed %llu\n",
              batch.c_str(), c.context, c.backend.c_str(), c.steps, c.optimizer.c_str(), c.lr, c.warmup, c.min_lr,
              c.layers, c.heads, c.width, static_cast<unsigned long long>(c.seed));
  if (const auto w = ddp::nn::blas::kernel_warning()) {
    std::fflush(stdout);
    std::fprintf(stderr, "warning: %s\n", w->c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  char_gpt::config c;
  CLI::App app{"ddp example: data-parallel training of a character-level GPT (ddp::nn::gpt) on the text of Debian's "
               "fortunes package"};
  app.add_option("--ranks", c.ranks, "number of ranks (in-process threads)")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--steps", c.steps, "optimizer steps (over as many epochs of the training text as they take)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{100000000}))->capture_default_str();
  app.add_option("--batch", c.batch, "sequences per rank per step (global batch = ranks x batch)")
      ->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--global-batch", c.global_batch, "sequences per step over all ranks, instead of --batch")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--context", c.context, "tokens (bytes) per sequence, and the model's context")
      ->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--layers", c.layers, "transformer blocks")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--heads", c.heads, "attention heads per block")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--width", c.width, "embedding width (a multiple of --heads); each block's MLP is 4 times wider")
      ->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--lr", c.lr, "peak learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--min-lr", c.min_lr, "learning rate at the last step (the cosine's floor)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--warmup", c.warmup, "steps of linear warm-up")->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay,
                 "weight decay of the weight matrices (decoupled for adamw, coupled for sgd; none on biases and "
                 "layer norms)")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--beta2", c.beta2, "AdamW's beta2")->check(CLI::Range(0.0, 0.9999))->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum")->check(CLI::Range(0.0, 0.999))->capture_default_str();
  app.add_option("--clip", c.clip, "gradient clipping by global norm (0: off)")->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--seed", c.seed, "seed of the initial weights, the data order and the sample")->capture_default_str();
  examples::add_policy_options(app, c, /*precision=*/false);  // ddp::nn::gpt keeps f32 parameters
  app.add_option("--corpus", c.corpus, "directory of the fortune files (Debian's fortunes package)")->capture_default_str();
#if DDP_EXAMPLE_WITH_MPI
  c.backend = "mpi";
  app.add_option("--backend", c.backend, "communicator: mpi, one rank per process under mpirun")
      ->check(examples::only("mpi", "in-process ranks are in char_gpt"))
      ->capture_default_str();
#else
  app.add_option("--backend", c.backend, "communicator: inproc, ranks as threads of this process")
      ->check(examples::only("inproc", "--backend mpi is in char_gpt_mpi (built when OpenMPI is found)"))
      ->capture_default_str();
#endif
  app.add_option("--log-every", c.log_every, "steps between progress lines (train loss, tokens/s, time left)")
      ->capture_default_str();
  app.add_option("--eval-every", c.eval_every, "steps between validation losses during training (0: at the end only)")
      ->capture_default_str();
  app.add_option("--eval-sequences", c.eval_sequences,
                 "validation sequences, spread evenly over the validation text, evaluated during training (0: all; "
                 "see --final-eval-sequences for the loss at the end)")
      ->capture_default_str();
  app.add_option("--final-eval-sequences", c.final_eval_sequences,
                 "validation sequences evaluated after the last step (0: all, every byte of the validation text "
                 "predicted once)")
      ->capture_default_str();
  app.add_flag("!--no-progress", c.progress, "no progress lines");
  app.add_option("--checkpoint", c.checkpoint,
                 "directory for checkpoints: the run goes on from the one there (same flags), saves one every "
                 "--checkpoint-every steps and after the last");
  app.add_option("--checkpoint-every", c.checkpoint_every, "--checkpoint: steps between saves (0: after the last only)")
      ->capture_default_str();
  app.add_option("--keep-last", c.keep_last, "--checkpoint keeps the last K checkpoints saved")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1000}))->capture_default_str();
  app.add_option("--prefetch", c.prefetch, "batches made ahead of the step on a thread per rank (0: none)")
      ->check(CLI::Range(0, 64))->capture_default_str();
  app.add_option("--sample-chars", c.sample_chars, "bytes generated after training (0: no sample)")->capture_default_str();
  app.add_option("--temperature", c.temperature, "the sample's temperature (0: the most likely byte each time)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--prompt", c.prompt, "the text the sample continues")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (c.width % c.heads != 0) {
    std::fprintf(stderr, "error: --width %zu is not a multiple of --heads %zu\n", c.width, c.heads);
    return 2;
  }
  if (c.optimizer == "sgd" && !app.count("--lr")) c.lr = 0.1f;  // --lr's default is AdamW's

  char_gpt::report r;
  const auto start = std::chrono::steady_clock::now();
  bool lead = true;
  try {
#if DDP_EXAMPLE_WITH_MPI
    ddp::mpi::environment env(&argc, &argv);
    const auto world = examples::mpi_world(app.count("--ranks") > 0, c.ranks);
    c.ranks = world.size;
    lead = world.rank == 0;
    if (lead) print_banner(c);
    char_gpt::run_with<ddp::mpi::communicator>(c, r);
#else
    print_banner(c);
    char_gpt::run_with<ddp::inproc::communicator>(c, r);
#endif
  } catch (const std::exception& e) {
    // An error the ranks agreed on is the same in every MPI process: rank 0 prints it.
    if (lead || !dynamic_cast<const ddp::collective_error*>(&e)) std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  if (!lead) return 0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("\nsummary\n  validation loss %.4f nats per byte (%.3f bits) over %zu sequences, after %zu steps\n  train loss      %.4f (the "
              "last steps')\n  training time   %.1f s of steps (wall %.1f s with evaluations)\n  throughput      %.0f "
              "tokens/s over %d rank(s)\n  model           %zu parameters: %zu layers, %zu heads, width %zu, context "
              "%zu\n  policies        %s\n",
              r.validation_loss, r.validation_loss / 0.6931471805599453, r.validation_sequences, r.steps, r.train_loss, r.train_seconds, wall,
              r.tokens_per_second, c.ranks, r.parameters, c.layers, c.heads, c.width, c.context, r.policies.c_str());
  if (c.sample_chars) {
    if (c.temperature > 0) std::printf("\nsample (temperature %.2f, seed %llu):\n", c.temperature, static_cast<unsigned long long>(c.seed));
    else std::printf("\nsample (the most likely byte each time):\n");
    std::printf("%s\n", r.sample.c_str());
  }
  return 0;
}
