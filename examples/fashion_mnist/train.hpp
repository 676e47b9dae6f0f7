#pragma once
// The data-parallel training run of the example, generic over the trainer's policies.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <numbers>
#include <string>
#include <type_traits>
#include <vector>

#include "config.hpp"
#include "model.hpp"
#include "run.hpp"
#include "ddp/data/fashion_mnist.hpp"
#include "ddp/data/loader.hpp"
#include "ddp/inproc/launch.hpp"
#if DDP_EXAMPLE_WITH_MPI
#include "ddp/mpi/communicator.hpp"
#endif
#if DDP_EXAMPLE_WITH_CUDA
#include "gpu_platform.hpp"
#endif
#if DDP_EXAMPLE_WITH_TORCH
#include "torch_platform.hpp"
#endif
#include "ddp/ddp.hpp"
#include "ddp/optim/schedule.hpp"
#include "ddp/host/linalg.hpp"
#include "../common/policy_choice.hpp"
#include "../common/trainer_policies.hpp"

namespace fmnist {

using ddp::data::fashion_mnist;
// The flags' schedule, as a multiplier of --lr at each step.
inline std::function<float(std::size_t)> lr_schedule(const config& c, std::size_t total) {
  if (c.schedule == "constant") return ddp::optim::schedule::constant{};
  return ddp::optim::schedule::cosine(total);  // down to zero over the whole run
}

// Accuracy over the full test set: trainer.evaluate deals each rank its share (in order, padded
// so every rank has as many images, the padding weighing nothing) and sums the counts over the
// ranks: exactly the 10,000 images, at any world size, in evaluation mode.
template <class Platform, class Trainer>
ddp::metric test_accuracy(Trainer& trainer, typename Platform::device& dev, const fashion_mnist& test) {
  const ddp::data::loader loader(test, 500, &fashion_mnist::collate);
  return trainer.evaluate(loader, [&](const auto& b) {
    auto ce = Platform::loss(dev, trainer.module().forward(Platform::input(dev, b.x)), b.y, b.weights);
    return ddp::metric{static_cast<double>(ce.correct), ce.samples};
  });
}

using train_loader = ddp::data::loader<fashion_mnist, decltype(&fashion_mnist::collate)>;

using trainer_policies = examples::trainer_policies<train_loader>;

// How often the host has waited for the device so far (a GPU's; 0 where the device does not count).
template <class Device>
std::uint64_t host_waits(const Device& dev) {
  if constexpr (requires { dev.host_waits(); }) return dev.host_waits();
  else return 0;
}

// One rank's run: --checkpoint's resume, the epochs, a save after each (with --checkpoint; the
// last --keep-last kept), the report. A template over the trainer's core, not the trainer.
template <class Platform, class Core>
void run_rank(Core& trainer, trainer_policies& policies, typename Platform::device& dev, const config& c,
              const fashion_mnist& train_set, const fashion_mnist& test_set, report& out) {
  const auto& comm = trainer.communicator();
  const bool lead = comm.rank() == 0;
  const std::size_t shards = policies.virtual_shards();
  if constexpr (requires { dev.reset_memory_high_water(); }) dev.reset_memory_high_water();
  const auto world = static_cast<std::size_t>(comm.size());
  // --global-batch, or --batch per rank; under --reduction invariant the loader makes one shard.
  const std::size_t global_batch = c.global_batch ? c.global_batch : c.batch * world;
  const std::size_t parts = shards ? shards : world;
  if (global_batch % parts != 0)
    throw std::invalid_argument("--global-batch " + std::to_string(global_batch) + " does not cut into " +
                                std::to_string(parts) + (shards ? " virtual shards" : " ranks") + ": choose a multiple of " +
                                std::to_string(parts));
  train_loader loader(train_set, global_batch / parts, &fashion_mnist::collate, ddp::data::prefetch{c.prefetch});
  // --checkpoint DIR: go on from the checkpoint there, if any, and save one after every epoch.
  if (!c.checkpoint.empty() && ddp::has_checkpoint(c.checkpoint)) {
    policies.load(c.checkpoint);
    if (lead)
      std::printf("resumed from the checkpoint in '%s': %llu epoch(s) done, step %llu\n", c.checkpoint.c_str(),
                  static_cast<unsigned long long>(policies.epochs_started()),
                  static_cast<unsigned long long>(trainer.steps()));
  }
  const int first_epoch = static_cast<int>(policies.epochs_started()) + 1;
  const std::size_t steps_per_epoch = policies.steps_per_epoch(train_set.size(), global_batch / parts);
  ddp::progress progress(comm.rank(), {.epochs = static_cast<std::size_t>(c.epochs), .steps_per_epoch = steps_per_epoch,
                                       .samples_per_step = global_batch, .first_step = trainer.steps(),
                                       .out = c.progress ? stdout : nullptr});
  const std::size_t total_steps = steps_per_epoch * static_cast<std::size_t>(c.epochs);
  const auto schedule = lr_schedule(c, total_steps);
  const auto start = std::chrono::steady_clock::now();
  std::size_t step = trainer.steps();  // the schedule's position: 0, or where a checkpoint left off
  std::uint64_t waits_in_steps = 0;
  std::size_t step_peak = 0;  // the most the device held in training steps beyond what it held between them
  const std::size_t first_step = step;
  ddp::timeline timeline;  // --trace FILE: every step's phases, written after the last epoch
  if (!c.trace.empty()) trainer.record_timeline(&timeline);
  trainer.overlap_optimizer(c.overlap_optimizer);
  for (int epoch = first_epoch; epoch <= c.epochs; ++epoch) {
    const auto epoch_start = std::chrono::steady_clock::now();
    ddp::exact_metric loss, accuracy;  // summed exactly: the same bits at any world size under --reduction invariant
    // One micro-batch: the last of a step steps, the others accumulate.
    auto micro_batch = [&](const auto& b, bool last) {
      auto f = [&](auto& replica) {
        auto ce = Platform::loss(dev, replica.forward(Platform::input(dev, b.x)), b.y, b.weights);
        replica.backward(ce.grad);
        loss.add(ce.loss_sum, ce.samples);
        accuracy.add(static_cast<double>(ce.correct), ce.samples);
      };
      if (last) trainer.step(f);
      else trainer.accumulate(f);
    };
    auto after_step = [&] {
      progress.step(loss.mean());
      ++step;
    };
    if constexpr (requires { dev.reset_memory_high_water(); }) dev.reset_memory_high_water();
    if (shards) {  // this rank's virtual shards of each step, in shard order
      for (const auto& batches : policies.epoch_shards(loader)) {
        trainer.learning_rate() = c.lr * schedule(step);
        const auto waits_before = host_waits(dev);
        for (std::size_t k = 0; k < batches.size(); ++k) micro_batch(batches[k], k + 1 == batches.size());
        waits_in_steps += host_waits(dev) - waits_before;
        after_step();
      }
    } else {
      auto batches = policies.epoch(loader);
      for (const auto& b : batches) {
        trainer.learning_rate() = c.lr * schedule(step);
        const auto waits_before = host_waits(dev);
        micro_batch(b, true);
        waits_in_steps += host_waits(dev) - waits_before;
        after_step();
      }
    }
    // Read before the evaluation, which gathers a fully sharded model whole.
    if constexpr (requires { dev.memory_high_water(); })
      step_peak = std::max(step_peak, dev.memory_high_water() - dev.memory_in_use());
    const auto global = trainer.reduce(std::array<ddp::exact_metric, 2>{loss, accuracy});
    const double epoch_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
    const ddp::metric test = test_accuracy<Platform>(trainer, dev, test_set);
    if (lead) {
      epoch_record e{epoch, global[0].mean(), global[1].mean(), test.mean(), epoch_seconds,
                     global[0].count() / epoch_seconds};
      std::printf("epoch %d/%d: train loss %.4f, train accuracy %.2f%%, test accuracy %.2f%% (%.0f images), "
                  "%.1f s, %.0f samples/s\n",
                  epoch, c.epochs, e.train_loss, 100 * e.train_accuracy, 100 * e.test_accuracy, test.count, e.seconds,
                  e.samples_per_second);
      std::fflush(stdout);
      out.epochs.push_back(e);
    }
    if (!c.checkpoint.empty()) policies.save(c.checkpoint, {.keep_last = c.keep_last});
  }
  if (!c.trace.empty()) {
    trainer.record_timeline(nullptr);
    ddp::write_chrome_trace(trainer.communicator(), dev, timeline, c.trace);
    if (lead)
      std::printf("trace: %zu events on rank 0%s, every rank in '%s' (open it in ui.perfetto.dev or chrome://tracing)\n",
                  timeline.events().size(), timeline.dropped() ? " (the rest dropped: the timeline is full)" : "",
                  c.trace.c_str());
  }
  if (first_epoch > c.epochs) {  // a checkpoint of the whole run: only the test set to report
    const ddp::metric test = test_accuracy<Platform>(trainer, dev, test_set);
    if (lead) out.epochs.push_back({c.epochs, 0, 0, test.mean(), 0, 0});
  }
  if (lead) {
    out.train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    out.samples_per_second = static_cast<double>((total_steps - first_step) * global_batch) / out.train_seconds;
    out.policies = policies.describe();
    if (c.overlap_optimizer) out.policies += "; the optimizer overlapped with the reductions";
    out.memory = trainer.memory();
    // What a step allocates beyond that (sharded_gradients' buckets while they reduce).
    if constexpr (requires { dev.memory_high_water(); }) out.memory_peak = out.memory.total() + step_peak;
    if constexpr (requires { dev.host_waits(); })
      out.host_waits_per_step = static_cast<double>(waits_in_steps) / static_cast<double>(std::max<std::size_t>(1, step - first_step));
  }
  trainer.gather_parameters();  // update::fully_sharded: the trained model back in the module before the trainer goes
}

template <class Trainer, class Platform>
void train_on_rank(typename Trainer::communicator_type& comm, typename Platform::device& dev, const config& c,
                   const fashion_mnist& train_set, const fashion_mnist& test_set, report& out) {
  auto m = Platform::make_model(dev, c.seed);
  examples::set_precision(m, c.precision);
  typename Trainer::optimizer_type opt{};
  opt.lr = c.lr;
  opt.weight_decay = c.weight_decay;
  if constexpr (requires { opt.momentum; }) opt.momentum = c.momentum;
  Trainer trainer(m, comm, dev, opt, {.seed = c.seed});
  examples::select_run_time_policies(trainer, c);
  examples::policies_of<Trainer, train_loader> policies(trainer);
  run_rank<Platform, typename Trainer::core_type>(trainer, policies, dev, c, train_set, test_set, out);
}

// One rank's training with the trainer type the flags name (examples/common/policy_choice.hpp).
template <class Comm, class Platform>
void train_with_flags(Comm& comm, typename Platform::device& dev, const config& c, const fashion_mnist& train_set,
                      const fashion_mnist& test_set, report& out) {
  examples::with_trainer_type<typename Platform::model, Comm, typename Platform::device>(
      c, [&]<class Trainer>(std::type_identity<Trainer>) {
        train_on_rank<Trainer, Platform>(comm, dev, c, train_set, test_set, out);
      });
}

template <class Launcher, class Platform>
void run_with(const config& c, report& out) {
  using Comm = typename Platform::template communicator<Launcher>;
  auto open = [&](fashion_mnist::split which) {
    return c.mapped ? fashion_mnist::map(which, c.data_dir) : fashion_mnist::load(which, c.data_dir);
  };
  const auto train_set = open(fashion_mnist::split::train);
  const auto test_set = open(fashion_mnist::split::test);
  auto rank = [&](Comm& comm, typename Platform::device& dev) {
    train_with_flags<Comm, Platform>(comm, dev, c, train_set, test_set, out);
  };
  if constexpr (std::is_same_v<Launcher, ddp::inproc::communicator>) {
    ddp::inproc::launch(c.ranks, [&](Launcher& launcher) { Platform::on_rank(launcher, c, rank); });
  } else {  // one rank per process: this process is one of them
    Launcher launcher;
    Platform::on_rank(launcher, c, rank);
  }
}

}  // namespace fmnist
