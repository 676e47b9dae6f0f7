// ddp-bench scaling: data-parallel scaling of the Fashion-MNIST example's model on in-process
// ranks, four set-ups interleaved in short rounds, so that a neighbour who takes cores or memory
// bandwidth for a few seconds slows all of them alike:
//   1 rank        one rank trains alone (the baseline);
//   N ranks       ddp::trainer on N in-process ranks, the same per-rank batch (update::replicated);
//   N sharded     the same with update::sharded: each rank updates 1/N of the parameters;
//   N sharded_gradients  update::sharded_gradients: also keeping only 1/N of the gradients;
//   N fully_sharded  update::fully_sharded: also keeping only 1/N of the parameters, gathered
//                 layer by layer in forward and backward;
//   N overlapped  N ranks whose optimizer updates each bucket as its reduction completes
//                 (trainer.overlap_optimizer), with the default buckets and with 1 MiB ones
//                 (several buckets: the updates of the first hide the last one's reduction);
//   N x 1 rank    N independent single-rank trainings at the same time, no communication:
//                 what this machine allows N ranks of this model, whatever ddp does;
//   N ranks bf16  (--hooks bf16,fp16,powersgd) N ranks whose gradients travel in 16 bits, or as
//                 rank-4 factors (comm_hook::powersgd<4>, compressed from the first step).
// --model gpt or gpt-10m: the same set-ups over ddp::nn::gpt (AdamW, synthetic tokens), in tokens/s.
// Speed-up = samples/s of N ranks over 1 rank; ceiling = N x 1 rank over 1 rank; ddp's
// efficiency = speed-up / ceiling (sharded can pass 100%: it does less optimizer work per rank
// than an independent training). Medians over the rounds; only training steps are timed.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "ddp_bench/commands.hpp"
#include "ddp_bench/gpt_workload.hpp"
#include "ddp/data/fashion_mnist.hpp"
#include "ddp/data/loader.hpp"
#include "ddp/ddp.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/host/linalg.hpp"
#include "ddp/policy/powersgd.hpp"
#include "model.hpp"

namespace bench {
namespace scaling_detail {

using ddp::data::fashion_mnist;
template <class Model, class Optimizer, class... More>
using trainer_for = ddp::trainer<Model, Optimizer, More...>;

const ddp::optim::sgd sgd{.lr = 0.01f, .momentum = 0.9f, .weight_decay = 0.0f};
const ddp::optim::adamw adamw{.lr = 1e-3f};

// What a set-up trains: the model, and the loss's gradient of a batch.
struct mlp_workload {
  using model_type = fmnist::model;
  using batch_type = ddp::data::weighted_batch<fashion_mnist::batch>;
  static model_type make() { return fmnist::make_model(1); }
  static ddp::nn::matrix loss_gradient(const ddp::nn::matrix& out, const batch_type& b) {
    return ddp::nn::softmax_cross_entropy(out, b.y).grad;
  }
};
struct gpt_workload {
  using model_type = ddp::nn::gpt;
  using batch_type = token_batch;
  ddp::nn::gpt_config config;
  model_type make() const { return model_type(config); }
  static ddp::nn::matrix loss_gradient(const ddp::nn::matrix& logits, const batch_type& b) {
    return ddp::nn::sequence_cross_entropy(logits, b.y).grad;
  }
};

// One rank's persistent part: its model replica and the batches it trains on, kept across rounds
// (each round builds a fresh trainer around them; only the steps are timed).
template <class Workload>
struct replica_state {
  typename Workload::model_type model;
  std::vector<typename Workload::batch_type> batches;
};

// Runs `steps` steps on an already-built trainer; returns the seconds from a common start.
template <class Workload, class Trainer>
double timed_steps(Trainer& t, const std::vector<typename Workload::batch_type>& batches, int steps) {
  t.communicator().barrier().wait();
  const auto t0 = clock_type::now();
  for (int s = 0; s < steps; ++s) {
    const auto& b = batches[static_cast<std::size_t>(s) % batches.size()];
    t.step([&](auto& r) { r.backward(Workload::loss_gradient(r.forward(b.x), b)); });
  }
  t.communicator().barrier().wait();
  const double seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  t.gather_parameters();  // update::fully_sharded: the model whole again before the trainer goes
  return seconds;
}

// Samples/s of ranks that each took `seconds[r]` for `steps` steps of `batch` samples: the
// slowest one decides.
double samples_per_second(const std::vector<double>& seconds, int steps, std::size_t batch) {
  return static_cast<double>(seconds.size() * static_cast<std::size_t>(steps) * batch) /
         *std::ranges::max_element(seconds);
}

// Samples/s of one world of `states.size()` ranks.
template <class Trainer, class Workload>
double run_world(std::vector<replica_state<Workload>>& states, int steps, std::size_t batch,
                 const typename Trainer::optimizer_type& opt, bool overlap = false) {
  const int ranks = static_cast<int>(states.size());
  auto seconds = ddp::inproc::launch(ranks, [&](ddp::inproc::communicator& comm) {
    ddp::host::device dev;
    Trainer t(states[static_cast<std::size_t>(comm.rank())].model, comm, dev, opt);
    t.overlap_optimizer(overlap);
    auto& hook = t.template policy<ddp::comm_hook::slot>();
    if constexpr (requires { hook.start_after = 0; }) hook.start_after = 0;  // powersgd: compressed from the first step
    return timed_steps<Workload>(t, states[static_cast<std::size_t>(comm.rank())].batches, steps);
  });
  return samples_per_second(seconds, steps, batch);
}

// Samples/s of `states.size()` single-rank worlds trained at the same time, started together.
template <class Workload, class Optimizer>
double run_independent(std::vector<replica_state<Workload>>& states, int steps, std::size_t batch, const Optimizer& opt) {
  std::barrier start(static_cast<std::ptrdiff_t>(states.size()));
  std::vector<double> seconds(states.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < states.size(); ++i)
    threads.emplace_back([&, i] {
      ddp::inproc::launch(1, [&](ddp::inproc::communicator& comm) {
        ddp::host::device dev;
        trainer_for<typename Workload::model_type, Optimizer> t(states[i].model, comm, dev, opt);
        start.arrive_and_wait();
        seconds[i] = timed_steps<Workload>(t, states[i].batches, steps);
      });
    });
  for (auto& t : threads) t.join();
  return samples_per_second(seconds, steps, batch);
}

// Runs every set-up `rounds` times in rotating order and prints the medians and ratios.
// `make_states(n, world)`: n replicas, replica r with the batches of rank r % world of `world`;
// `batch`: what a rank's step counts for the rates (samples, or a GPT's tokens).
template <class Workload, class Optimizer, class MakeStates>
void compare(const Optimizer& opt, MakeStates make_states, int ranks, int rounds, int steps, std::size_t batch,
             const std::vector<std::string>& hooks, report& out) {
  auto single = make_states(1, 1), parallel = make_states(ranks, ranks), sharded = make_states(ranks, ranks),
       independent = make_states(ranks, 1), hooked = make_states(ranks, ranks), zero2 = make_states(ranks, ranks),
       overlapped = make_states(ranks, ranks), small_buckets = make_states(ranks, ranks), zero3 = make_states(ranks, ranks);
  using model_t = typename Workload::model_type;

  struct setup {
    std::string name;
    std::vector<double> rates;
  };
  const std::string n = std::to_string(ranks);
  std::vector<setup> setups{{"1 rank", {}}, {n + " ranks", {}}, {n + " sharded", {}}, {n + " x 1 rank", {}},
                            {n + " sharded_gradients", {}}, {n + " ranks overlapped", {}},
                            {n + " ranks 1 MiB overlapped", {}}, {n + " fully_sharded", {}}};
  const std::size_t first_hook = setups.size();
  for (const auto& h : hooks) setups.push_back({n + " ranks " + h, {}});
  using replicated = ddp::update::replicated;
  using one_mib = ddp::bucket_cap<std::size_t{1} << 20>;
  auto run = [&](std::size_t which) {
    if (which == 0) return run_world<trainer_for<model_t, Optimizer>>(single, steps, batch, opt);
    if (which == 1) return run_world<trainer_for<model_t, Optimizer>>(parallel, steps, batch, opt);
    if (which == 2) return run_world<trainer_for<model_t, Optimizer, ddp::update::sharded>>(sharded, steps, batch, opt);
    if (which == 3) return run_independent(independent, steps, batch, opt);
    if (which == 4)
      return run_world<trainer_for<model_t, Optimizer, ddp::update::sharded_gradients>>(zero2, steps, batch, opt);
    if (which == 5) return run_world<trainer_for<model_t, Optimizer>>(overlapped, steps, batch, opt, /*overlap=*/true);
    if (which == 6)
      return run_world<trainer_for<model_t, Optimizer, one_mib>>(small_buckets, steps, batch, opt, /*overlap=*/true);
    if (which == 7)
      return run_world<trainer_for<model_t, Optimizer, ddp::update::fully_sharded>>(zero3, steps, batch, opt);
    if (hooks[which - first_hook] == "bf16")
      return run_world<trainer_for<model_t, Optimizer, replicated, ddp::comm_hook::bf16>>(hooked, steps, batch, opt);
    if (hooks[which - first_hook] == "powersgd")
      return run_world<trainer_for<model_t, Optimizer, replicated, ddp::comm_hook::powersgd<4>>>(hooked, steps, batch,
                                                                                                  opt);
    return run_world<trainer_for<model_t, Optimizer, replicated, ddp::comm_hook::fp16>>(hooked, steps, batch, opt);
  };
  for (std::size_t i = 0; i < setups.size(); ++i) run(i);  // warm-up: page in, grow the heaps
  for (int r = 0; r < rounds; ++r)
    for (std::size_t k = 0; k < setups.size(); ++k) {
      const std::size_t which = (k + static_cast<std::size_t>(r)) % setups.size();
      setups[which].rates.push_back(run(which));
    }

  const double single_rate = median(setups[0].rates), independent_rate = median(setups[3].rates);
  for (const auto& s : setups) {
    const auto [lo, hi] = std::ranges::minmax(s.rates);
    const double rate = median(s.rates);
    out.add({s.name, rate, lo, hi, rate / single_rate, rate / independent_rate});
  }
  char line[200];
  std::snprintf(line, sizeof line, "ceiling (%d independent / 1 rank): %.2fx", ranks, independent_rate / single_rate);
  out.note(line);
  for (std::size_t k = 1; k < setups.size(); ++k) {
    if (k == 3) continue;
    const double rate = median(setups[k].rates);
    std::snprintf(line, sizeof line, "speed-up %s / 1 rank: %.2fx; ddp efficiency %.0f%% of the ceiling", setups[k].name.c_str(),
                  rate / single_rate, 100 * rate / independent_rate);
    out.note(line);
  }
}

}  // namespace scaling_detail


int run_scaling(const scaling_params& p) {
  using namespace scaling_detail;
  const std::vector<column> columns{{"setup", 12, 0}, {is_gpt_model(p.model) ? "tokens/s" : "samples/s", 10, 0},
                                    {"min", 8, 0}, {"max", 8, 0}, {"vs_1_rank", 9, 2}, {"vs_ceiling", 10, 2}};
  const std::string timing = std::to_string(p.steps) + " steps per set-up, " + std::to_string(p.rounds) +
                             " rounds (medians)";
  if (is_gpt_model(p.model)) {
    // A GPT trains with AdamW (the char_gpt example's optimizer) only: one optimizer's trainer types.
    const gpt_workload w{gpt_shape(p.model)};
    report out("scaling",
               describe_gpt(w.config, w.make().parameter_count()) + ", optimizer adamw, batch " +
                   std::to_string(p.batch) + " sequences of " + std::to_string(w.config.context) +
                   " synthetic tokens per rank, " + timing,
               columns);
    out.begin(true);
    auto make_states = [&](int n, int world) {
      std::vector<replica_state<gpt_workload>> s;
      for (int r = 0; r < n; ++r) {
        s.push_back({w.make(), {}});
        const auto rank = static_cast<std::uint64_t>(r % world);
        for (int k = 0; k < std::min(p.steps, 8); ++k)
          s.back().batches.push_back(make_token_batch(w.config, p.batch, 1000 * rank + static_cast<std::uint64_t>(k)));
      }
      return s;
    };
    // Rates in tokens/s: a "sample" of the batch is a sequence of `context` tokens.
    compare<gpt_workload>(adamw, make_states, p.ranks, p.rounds, p.steps, p.batch * w.config.context, p.hooks, out);
    out.write(p.out);
    return 0;
  }
  const std::string dir = p.data_dir.empty() ? std::string(fashion_mnist::default_directory) : p.data_dir;
  const auto train = fashion_mnist::load(fashion_mnist::split::train, dir);
  if (p.batch > train.size() / static_cast<std::size_t>(p.ranks))
    throw std::invalid_argument("--batch " + std::to_string(p.batch) + " is more than one rank's share of the " +
                                std::to_string(train.size()) + " training images at --ranks " + std::to_string(p.ranks) +
                                "; use --batch " + std::to_string(train.size() / static_cast<std::size_t>(p.ranks)) +
                                " or less");
  report out("scaling",
             "the example's model (784-512-512-10, batch_norm), optimizer " + p.optimizer + ", batch " +
                 std::to_string(p.batch) + " per rank, " + timing,
             columns);
  out.begin(true);
  ddp::data::loader loader(train, p.batch, &fashion_mnist::collate);
  auto make_states = [&](int n, int world) {
    std::vector<replica_state<mlp_workload>> s;
    for (int r = 0; r < n; ++r) {
      // Rank r of `world`: the distributed sampler's share of epoch 0, as the trainer would draw it.
      auto indices = ddp::sampler::distributed<>::indices(train.size(), r % world, world, 1, 0);
      indices.resize(std::min(indices.size(), static_cast<std::size_t>(p.steps) * p.batch));
      s.push_back({mlp_workload::make(), loader.batches(indices).to_vector()});
    }
    return s;
  };
  if (p.optimizer == "sgd") compare<mlp_workload>(sgd, make_states, p.ranks, p.rounds, p.steps, p.batch, p.hooks, out);
  else compare<mlp_workload>(adamw, make_states, p.ranks, p.rounds, p.steps, p.batch, p.hooks, out);
  out.write(p.out);
  return 0;
}

}  // namespace bench
