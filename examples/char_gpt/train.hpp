#pragma once
// The data-parallel training run of the character-level GPT, generic over the trainer's policies.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../common/policy_choice.hpp"
#include "../common/trainer_policies.hpp"
#include "config.hpp"
#include "corpus.hpp"
#include "ddp/data/loader.hpp"
#include "ddp/ddp.hpp"
#include "ddp/host/device.hpp"
#include "ddp/host/linalg.hpp"  // the host device's matrix algebra, for --hook powersgd
#include "ddp/inproc/launch.hpp"
#include "ddp/nn/gpt.hpp"
#include "ddp/nn/sequence_cross_entropy.hpp"
#include "ddp/optim/schedule.hpp"
#include "run.hpp"
#if DDP_EXAMPLE_WITH_MPI
#include "ddp/mpi/communicator.hpp"
#endif

namespace char_gpt {

using train_loader = ddp::data::loader<windows, decltype(&windows::collate)>;
using trainer_policies = examples::trainer_policies<train_loader>;

inline ddp::nn::gpt_config model_shape(const config& c) {
  return {.vocab = 256, .context = c.context, .layers = c.layers, .heads = c.heads, .width = c.width,
          .causal = c.causal, .seed = c.seed};
}

// The loss of a batch: the mean over its real positions (a padding sequence weighs nothing).
template <class Model>
ddp::nn::cross_entropy_result batch_loss(Model& m, const ddp::data::weighted_batch<batch>& b) {
  return ddp::nn::sequence_cross_entropy(m.forward(b), b.targets, b.weights, b.length);
}

// Mean loss per token over `set`: trainer.evaluate deals each rank its share and sums over the
// ranks, every sequence counted once at any world size, in evaluation mode.
template <class Core>
double loss_over(Core& trainer, const windows& set) {
  const ddp::data::loader loader(set, 32, &windows::collate);
  return trainer
      .evaluate(loader,
                [&](const auto& b) {
                  const auto ce = batch_loss(trainer.module(), b);
                  return ddp::metric{ce.loss_sum, ce.samples};
                })
      .mean();
}

// One rank's run: --checkpoint's resume, --steps steps over as many epochs of the training
// windows as they take, a progress line every --log-every steps, the validation loss on
// --eval-sequences every --eval-every steps and on --final-eval-sequences (all) at the end.
// A template over the trainer's core, not the trainer: compiled once per communicator.
template <class Core>
void run_rank(Core& trainer, trainer_policies& policies, const config& c, const corpus& text, report& out) {
  auto& comm = trainer.communicator();
  const bool lead = comm.rank() == 0;
  const std::size_t shards = policies.virtual_shards();
  const auto world = static_cast<std::size_t>(comm.size());
  const std::size_t global_batch = c.global_batch ? c.global_batch : c.batch * world;
  const std::size_t parts = shards ? shards : world;
  if (global_batch % parts != 0)
    throw std::invalid_argument("--global-batch " + std::to_string(global_batch) + " does not cut into " +
                                std::to_string(parts) + (shards ? " virtual shards" : " ranks") +
                                ": choose a multiple of " + std::to_string(parts));
  const windows train_set(text.train, c.context), validation_set(text.validation, c.context, c.final_eval_sequences),
      estimate_set(text.validation, c.context, c.eval_sequences);
  train_loader loader(train_set, global_batch / parts, &windows::collate, ddp::data::prefetch{c.prefetch});
  if (!c.checkpoint.empty() && ddp::has_checkpoint(c.checkpoint)) {
    policies.load(c.checkpoint);
    if (lead)
      std::printf("resumed from the checkpoint in '%s' at step %llu\n", c.checkpoint.c_str(),
                  static_cast<unsigned long long>(trainer.steps()));
  }
  trainer.overlap_optimizer(c.overlap_optimizer);
  const auto schedule = ddp::optim::schedule::linear_warmup(
      c.warmup, ddp::optim::schedule::cosine(c.steps, c.lr > 0 ? c.min_lr / c.lr : 0.0f));
  const double tokens_per_step = static_cast<double>(global_batch * c.context);
  const std::size_t first_step = trainer.steps();
  std::size_t step = first_step;
  double train_seconds = 0;
  ddp::exact_metric interval;  // the training loss since the last progress line
  auto save = [&] { policies.save(c.checkpoint, {.keep_last = c.keep_last}); };
  // After each step, outside the timed part: the progress line, the estimate, the checkpoint.
  auto after_step = [&] {
    const bool last = step == c.steps;
    if ((c.log_every && step % c.log_every == 0) || last) {
      const double loss = trainer.reduce(std::array<ddp::exact_metric, 1>{interval})[0].mean();
      interval = {};
      if (lead) out.train_loss = loss;
      const double rate = static_cast<double>(step - first_step) * tokens_per_step / train_seconds;
      if (lead && c.progress) {
        std::printf("step %zu/%zu  train loss %.4f  %.0f tokens/s  %s elapsed, %s left\n", step, c.steps, loss, rate,
                    ddp::format_duration(train_seconds).c_str(),
                    ddp::format_duration(static_cast<double>(c.steps - step) * tokens_per_step / rate).c_str());
        std::fflush(stdout);
      }
    }
    if (c.eval_every && step % c.eval_every == 0 && !last) {
      const double loss = loss_over(trainer, estimate_set);
      if (lead && c.progress) {
        std::printf("step %zu/%zu  validation loss %.4f (%zu sequences)\n", step, c.steps, loss, estimate_set.size());
        std::fflush(stdout);
      }
    }
    if (!c.checkpoint.empty() && ((c.checkpoint_every && step % c.checkpoint_every == 0) || last)) save();
  };
  auto micro_batch = [&](const auto& b, bool final) {
    auto f = [&](auto& replica) {
      const auto ce = batch_loss(replica, b);
      replica.backward(ce.grad);
      interval.add(ce.loss_sum, ce.samples);
    };
    if (final) trainer.step(f);
    else trainer.accumulate(f);
  };
  auto timed = [&](auto&& work) {
    const auto start = std::chrono::steady_clock::now();
    work();
    train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  while (step < c.steps) {  // an epoch at a time, the last one cut short at --steps
    if (shards) {           // this rank's virtual shards of each step, in shard order
      for (const auto& batches : policies.epoch_shards(loader)) {
        trainer.learning_rate() = c.lr * schedule(step);
        timed([&] {
          for (std::size_t k = 0; k < batches.size(); ++k) micro_batch(batches[k], k + 1 == batches.size());
        });
        ++step;
        after_step();
        if (step == c.steps) break;
      }
    } else {
      auto batches = policies.epoch(loader);
      for (const auto& b : batches) {
        trainer.learning_rate() = c.lr * schedule(step);
        timed([&] { micro_batch(b, true); });
        ++step;
        after_step();
        if (step == c.steps) break;
      }
    }
  }
  const double validation_loss = loss_over(trainer, validation_set);
  if (lead) {
    out.validation_loss = validation_loss;
    out.validation_sequences = validation_set.size();
    out.steps = step;
    out.train_seconds = train_seconds;
    out.tokens_per_second =
        train_seconds > 0 ? static_cast<double>(step - first_step) * tokens_per_step / train_seconds : 0;
    out.policies = policies.describe();
    if (c.overlap_optimizer) out.policies += "; the optimizer overlapped with the reductions";
  }
  trainer.gather_parameters();  // update::fully_sharded: the trained model back in the module before the trainer goes
}

// Text generated from `prompt`: each next byte drawn from the model's distribution at
// `temperature` (0: the most likely byte) with a fixed seed, the model fed the last `context`
// bytes at most.
inline std::string generate(ddp::nn::gpt& model, const config& c) {
  std::mt19937_64 random(c.seed);
  std::vector<std::int32_t> text;
  for (unsigned char ch : c.prompt.empty() ? std::string("\n") : c.prompt) text.push_back(ch);
  const std::size_t prompt_length = text.size();
  model.eval();
  for (std::size_t i = 0; i < c.sample_chars; ++i) {
    const std::size_t length = std::min(text.size(), c.context);
    ddp::nn::token_batch x{.sequences = 1, .length = length,
                           .tokens = std::vector<std::int32_t>(text.end() - static_cast<std::ptrdiff_t>(length), text.end())};
    const auto logits = model.forward(x);
    const float* z = logits.row(length - 1);
    std::size_t next = static_cast<std::size_t>(std::max_element(z, z + logits.cols) - z);
    if (c.temperature > 0) {
      std::vector<double> p(logits.cols);
      double sum = 0;
      for (std::size_t v = 0; v < p.size(); ++v) sum += p[v] = std::exp(static_cast<double>(z[v] - z[next]) / c.temperature);
      double u = std::generate_canonical<double, 53>(random) * sum;
      for (next = 0; next + 1 < p.size() && u >= p[next]; ++next) u -= p[next];
    }
    text.push_back(static_cast<std::int32_t>(next));
  }
  std::string sample;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto ch = static_cast<unsigned char>(text[i]);
    // Control bytes (the corpus's backspace overstrikes) shown as '?'; the prompt as given.
    sample.push_back(i < prompt_length || ch >= 0x20 || ch == '\n' || ch == '\t' ? static_cast<char>(ch) : '?');
  }
  return sample;
}

template <class Trainer>
void train_on_rank(typename Trainer::communicator_type& comm, const config& c, const corpus& text, report& out) {
  ddp::nn::gpt model(model_shape(c));
  examples::set_precision(model, c.precision);
  {
    ddp::host::device dev;
    typename Trainer::optimizer_type opt{};
    opt.lr = c.lr;
    opt.weight_decay = c.weight_decay;
    if constexpr (requires { opt.momentum; }) opt.momentum = c.momentum;
    if constexpr (requires { opt.beta2; }) {
      opt.beta1 = c.beta1;
      opt.beta2 = c.beta2;
    }
    Trainer trainer(model, comm, dev, opt, {.seed = c.seed});
    examples::select_run_time_policies(trainer, c);
    // Weight decay on the matrices only (the linear and embedding weights), as nanoGPT.
    trainer.set_parameter_group(
        [](std::string_view name) { return name.ends_with(".bias") || name.find("ln_") != std::string_view::npos; },
        {.weight_decay = 0.0f});
    if (c.clip > 0) trainer.clip_gradient_norm(c.clip);
    examples::policies_of<Trainer, train_loader> policies(trainer);
    run_rank<typename Trainer::core_type>(trainer, policies, c, text, out);
  }
  // The trainer is gone and the module holds the trained weights: rank 0 writes the sample alone.
  if (comm.rank() == 0) {
    out.parameters = model.parameter_count();
    out.sample = generate(model, c);
  }
}

template <class Launcher>
void run_with(const config& c, report& out) {
  const auto text = corpus::load(c.corpus);
  auto rank = [&](Launcher& comm) {
    examples::with_trainer_type<ddp::nn::gpt, Launcher, ddp::host::device>(
        c, [&]<class Trainer>(std::type_identity<Trainer>) { train_on_rank<Trainer>(comm, c, text, out); });
  };
  if constexpr (std::is_same_v<Launcher, ddp::inproc::communicator>) {
    ddp::inproc::launch(c.ranks, rank);
  } else {  // one rank per process: this process is one of them
    Launcher launcher;
    rank(launcher);
  }
}

}  // namespace char_gpt
