// The character-level GPT of examples/char_gpt with libtorch's layers (gpt_torch.hpp), trained
// data-parallel by a ddp::trainer through ddp::torch::module: the same corpus and split, the
// same recipe (AdamW, warm-up then cosine, clipping at 1.0), in-process ranks.
//
//   build/examples/char_gpt_torch/char_gpt_torch --ranks 2 --steps 2000
//
// Prints the training loss every --log-every steps, the validation loss every --eval-every steps
// and at the end, and tokens/s of the training steps alone (evaluation not counted).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numbers>
#include <span>
#include <string>
#include <vector>

#include "corpus.hpp"
#include "ddp/data/loader.hpp"
#include "ddp/ddp.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/nn/blas.hpp"
#include "ddp/optim/schedule.hpp"
#include "ddp/torch/allocator.hpp"
#include "ddp/torch/module.hpp"
#include "ddp/torch/seed.hpp"
#include "gpt_torch.hpp"

namespace {

struct options {
  int ranks = 2;
  std::size_t steps = 2000;
  std::size_t batch = 12;  // sequences per rank
  std::int64_t context = 64, layers = 4, heads = 4, width = 128;
  float lr = 1e-3f, min_lr = 1e-4f, weight_decay = 0.1f, beta1 = 0.9f, beta2 = 0.99f, clip = 1.0f;
  std::size_t warmup = 100;
  std::uint64_t seed = 1;
  std::size_t log_every = 100, eval_every = 0, eval_sequences = 512, final_eval_sequences = 0;
  std::string corpus = char_gpt::default_corpus_directory;
  std::string update = "replicated";
  bool overlap_optimizer = false;
};

// The example's schedule (examples/char_gpt/train.hpp): a linear warm-up over --warmup steps
// times a cosine over all --steps from 1 down to --min-lr / --lr.
float lr_factor(const options& o, std::size_t step) {
  const auto schedule = ddp::optim::schedule::linear_warmup(
      o.warmup, ddp::optim::schedule::cosine(o.steps, o.lr > 0 ? o.min_lr / o.lr : 0.0f));
  return schedule(step);
}

using net = ddp::torch::module<char_gpt_torch::gpt>;

// Mean cross-entropy over the batch's real positions (a padded sequence weighs nothing) and its
// parts for a reduced metric.
struct sequence_loss {
  torch::Tensor grad;
  double sum = 0, count = 0;
};
sequence_loss loss_of(const torch::Tensor& logits, const char_gpt::batch& b, const ddp::sample_weights& w) {
  const auto n = static_cast<std::int64_t>(b.targets.size());
  const auto t = static_cast<std::int64_t>(b.length);
  const auto y = torch::from_blob(const_cast<std::int32_t*>(b.targets.data()), {n}, torch::kInt).to(torch::kLong);
  const auto per_sequence = torch::from_blob(const_cast<float*>(w.per_sample.data()),
                                             {static_cast<std::int64_t>(w.per_sample.size()), 1});
  const auto weight = per_sequence.expand({per_sequence.size(0), t}).reshape({n});
  const auto ce = torch::nn::functional::cross_entropy(
      logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  sequence_loss out;
  out.grad = (ce * weight).sum() / (w.divisor() * static_cast<double>(t));
  out.sum = (ce.detach() * weight).sum().item<double>();
  out.count = w.total() * static_cast<double>(t);
  return out;
}

torch::Tensor input_of(const char_gpt::batch& b) {
  return torch::from_blob(const_cast<std::int32_t*>(b.tokens.data()),
                          {static_cast<std::int64_t>(b.sequences), static_cast<std::int64_t>(b.length)}, torch::kInt)
      .to(torch::kLong);
}

template <class Update>
void train_rank(ddp::inproc::communicator& comm, const options& o, const char_gpt::corpus& text) {
  using trainer_t = ddp::trainer<net, ddp::optim::adamw, Update>;
  const char_gpt_torch::gpt_shape shape{.context = o.context, .layers = o.layers, .heads = o.heads, .width = o.width};
  net model(ddp::torch::build_seeded(o.seed, [&] { return char_gpt_torch::gpt(shape); }));
  std::int64_t parameters = 0;
  for (const auto& p : model.net()->parameters()) parameters += p.numel();
  ddp::host::device dev;
  trainer_t trainer(model, comm, dev, ddp::optim::adamw{.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2,
                                                        .weight_decay = o.weight_decay}, {.seed = o.seed});
  // Weight decay on the matrices only (linear and embedding weights), as nanoGPT.
  trainer.set_parameter_group(
      [](std::string_view name) { return name.ends_with(".bias") || name.find("ln_") != std::string_view::npos; },
      {.weight_decay = 0.0f});
  trainer.clip_gradient_norm(o.clip);
  trainer.overlap_optimizer(o.overlap_optimizer);

  const auto length = static_cast<std::size_t>(o.context);
  const char_gpt::windows train_set(text.train, length), validation_set(text.validation, length, o.final_eval_sequences),
      estimate_set(text.validation, length, o.eval_sequences);
  const ddp::data::loader train_loader(train_set, o.batch, &char_gpt::windows::collate);
  const bool lead = comm.rank() == 0;
  auto validation_loss = [&](const char_gpt::windows& set) {
    const ddp::data::loader loader(set, 32, &char_gpt::windows::collate);
    const ddp::metric m = trainer.evaluate(loader, [&](const auto& b) {
      const auto l = loss_of(trainer.module().forward(input_of(b)), b, b.weights);
      return ddp::metric{l.sum, l.count};
    });
    return m.mean();
  };

  std::size_t step = 0;
  double train_seconds = 0, tokens = 0;
  ddp::exact_metric window;  // training loss since the last log line
  while (step < o.steps) {
    auto batches = trainer.epoch(train_loader);
    auto start = std::chrono::steady_clock::now();
    for (const auto& b : batches) {
      if (step == o.steps) break;
      trainer.learning_rate() = o.lr * lr_factor(o, step);
      trainer.step([&](auto& replica) {
        const auto l = loss_of(replica.forward(input_of(b)), b, b.weights);
        replica.backward(l.grad);
        window.add(l.sum, l.count);
      });
      ++step;
      tokens += static_cast<double>(o.batch * length) * comm.size();
      const bool log = o.log_every && step % o.log_every == 0;
      const bool eval = o.eval_every && step % o.eval_every == 0 && step != o.steps;
      if (log || eval) {
        train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double train_loss = trainer.reduce(std::array<ddp::exact_metric, 1>{window})[0].mean();
        window = {};
        const double val = eval ? validation_loss(estimate_set) : NAN;
        if (lead) {
          std::printf("step %zu/%zu  train loss %.4f  %.0f tokens/s\n", step, o.steps, train_loss, tokens / train_seconds);
          if (eval) std::printf("step %zu/%zu  validation loss %.4f (%zu sequences)\n", step, o.steps, val, estimate_set.size());
          std::fflush(stdout);
        }
        start = std::chrono::steady_clock::now();
      }
    }
    train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double val = validation_loss(validation_set);
  if (lead) {  // examples/char_gpt's summary lines
    std::printf("\nsummary\n  validation loss %.4f nats per byte (%.3f bits) over %zu sequences, after %zu steps\n"
                "  training time   %.1f s of steps\n  throughput      %.0f tokens/s over %d rank(s)\n"
                "  model           %lld parameters: %lld layers, %lld heads, width %lld, context %lld\n"
                "  policies        %s\n",
                val, val / std::numbers::ln2, validation_set.size(), step, train_seconds, tokens / train_seconds, comm.size(),
                static_cast<long long>(parameters), static_cast<long long>(o.layers), static_cast<long long>(o.heads),
                static_cast<long long>(o.width), static_cast<long long>(o.context), trainer.describe().c_str());
  }
  trainer.gather_parameters();
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app("char_gpt_torch: the character-level GPT in libtorch, trained data-parallel by ddp");
  app.add_option("--ranks", o.ranks, "in-process ranks")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--steps", o.steps, "training steps")->check(CLI::Range(1, 100000000))->capture_default_str();
  app.add_option("--batch", o.batch, "sequences per rank per step")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--context", o.context, "tokens per sequence")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--layers", o.layers, "transformer blocks")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--heads", o.heads, "attention heads")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--width", o.width, "embedding width (a multiple of --heads)")->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--lr", o.lr, "peak learning rate")->capture_default_str();
  app.add_option("--min-lr", o.min_lr, "learning rate at the last step")->capture_default_str();
  app.add_option("--warmup", o.warmup, "warm-up steps")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW's decay of the weight matrices")->capture_default_str();
  app.add_option("--beta2", o.beta2, "AdamW's beta2")->capture_default_str();
  app.add_option("--clip", o.clip, "gradient clipping by global norm (0: off)")->capture_default_str();
  app.add_option("--seed", o.seed, "the weights' and the sampler's seed")->capture_default_str();
  app.add_option("--log-every", o.log_every, "steps between training-loss lines (0: none)")->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "steps between validation losses (0: at the end only)")
      ->capture_default_str();
  app.add_option("--eval-sequences", o.eval_sequences,
                 "validation sequences, spread evenly over the validation text, evaluated during training (0: all)")
      ->capture_default_str();
  app.add_option("--final-eval-sequences", o.final_eval_sequences, "validation sequences evaluated after the last step "
                 "(0: all)")->capture_default_str();
  app.add_option("--corpus", o.corpus, "directory of the corpus (Debian's fortunes)")->capture_default_str();
  app.add_option("--update", o.update, "replicated, sharded or sharded_gradients")
      ->check(CLI::IsMember({"replicated", "sharded", "sharded_gradients"}))->capture_default_str();
  app.add_flag("--overlap-optimizer", o.overlap_optimizer, "update each bucket as soon as its reduction completes");
  CLI11_PARSE(app, argc, argv);
  if (o.width % o.heads != 0) {
    std::fprintf(stderr, "--width %lld is not a multiple of --heads %lld\n", static_cast<long long>(o.width),
                 static_cast<long long>(o.heads));
    return 2;
  }
  try {
    const auto text = char_gpt::corpus::load(o.corpus);
    ddp::torch::retain_freed_memory();
    ddp::inproc::launch(o.ranks, [&](ddp::inproc::communicator& comm) {
      torch::set_num_threads(1);  // one intra-op thread per rank: the ranks are the parallelism
      ddp::nn::blas::use_one_thread_per_rank();
      if (o.update == "sharded") train_rank<ddp::update::sharded>(comm, o, text);
      else if (o.update == "sharded_gradients") train_rank<ddp::update::sharded_gradients>(comm, o, text);
      else train_rank<ddp::update::replicated>(comm, o, text);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "char_gpt_torch: %s\n", e.what());
    return 1;
  }
  return 0;
}
