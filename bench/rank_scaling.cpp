// Data-parallel scaling of the Fashion-MNIST example's model on in-process ranks, measured in
// one run with four set-ups interleaved in short rounds, so that a neighbour who takes cores or
// memory bandwidth for a few seconds slows all of them alike:
//   1 rank        one rank trains alone (the baseline);
//   N ranks       ddp::trainer on N in-process ranks, the same per-rank batch, every rank
//                 updating every parameter (update::replicated, the default);
//   N sharded     the same with update::sharded: each rank updates 1/N of the parameters;
//   N x 1 rank    N independent single-rank trainings at the same time, no communication:
//                 what this machine allows N ranks of this model, whatever ddp does.
// Speed-up = samples/s of N ranks over 1 rank; ceiling = N x 1 rank over 1 rank; ddp's
// efficiency = speed-up / ceiling (sharded can pass 100%: it does less optimizer work per rank
// than an independent training). Medians over the rounds; only training steps are timed.
//   rank_scaling [--ranks 2] [--rounds 15] [--steps 120] [--batch 64] [--optimizer sgd|adamw]
//                [--data-dir DIR]

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "collective_sweep.hpp"
#include "options.hpp"
#include "ddp/data/fashion_mnist.hpp"
#include "ddp/data/loader.hpp"
#include "ddp/ddp.hpp"
#include "ddp/inproc/launch.hpp"
#include "model.hpp"

namespace {

using ddp::data::fashion_mnist;
template <class Optimizer, class Update = ddp::update::replicated>
using trainer_for = ddp::trainer<fmnist::model, Optimizer, Update>;
using batches_t = std::vector<ddp::data::weighted_batch<fashion_mnist::batch>>;
using clock_type = std::chrono::steady_clock;

const ddp::optim::sgd sgd{.lr = 0.01f, .momentum = 0.9f, .weight_decay = 0.0f};
const ddp::optim::adamw adamw{.lr = 1e-3f};

// One rank's persistent part: its model replica and the batches it trains on, kept across rounds
// (each round builds a fresh trainer around them; only the steps are timed).
struct replica_state {
  fmnist::model model;
  batches_t batches;
};

// Runs `steps` steps on an already-built trainer; returns the seconds from a common start.
template <class Trainer>
double timed_steps(Trainer& t, const batches_t& batches, int steps) {
  t.communicator().barrier().wait();
  const auto t0 = clock_type::now();
  for (int s = 0; s < steps; ++s) {
    const auto& b = batches[static_cast<std::size_t>(s) % batches.size()];
    t.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
  }
  t.communicator().barrier().wait();
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Samples/s of ranks that each took `seconds[r]` for `steps` steps of `batch` samples: the
// slowest one decides.
double samples_per_second(const std::vector<double>& seconds, int steps, std::size_t batch) {
  return static_cast<double>(seconds.size() * static_cast<std::size_t>(steps) * batch) /
         *std::ranges::max_element(seconds);
}

// Samples/s of one world of `states.size()` ranks.
template <class Trainer>
double run_world(std::vector<replica_state>& states, int steps, std::size_t batch,
                 const typename Trainer::optimizer_type& opt) {
  const int ranks = static_cast<int>(states.size());
  auto seconds = ddp::inproc::launch(ranks, [&](ddp::inproc::communicator& comm) {
    ddp::host::device dev;
    Trainer t(states[static_cast<std::size_t>(comm.rank())].model, comm, dev, opt);
    return timed_steps(t, states[static_cast<std::size_t>(comm.rank())].batches, steps);
  });
  return samples_per_second(seconds, steps, batch);
}

// Samples/s of `states.size()` single-rank worlds trained at the same time, started together.
template <class Optimizer>
double run_independent(std::vector<replica_state>& states, int steps, std::size_t batch, const Optimizer& opt) {
  std::barrier start(static_cast<std::ptrdiff_t>(states.size()));
  std::vector<double> seconds(states.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < states.size(); ++i)
    threads.emplace_back([&, i] {
      ddp::inproc::launch(1, [&](ddp::inproc::communicator& comm) {
        ddp::host::device dev;
        trainer_for<Optimizer> t(states[i].model, comm, dev, opt);
        start.arrive_and_wait();
        seconds[i] = timed_steps(t, states[i].batches, steps);
      });
    });
  for (auto& t : threads) t.join();
  return samples_per_second(seconds, steps, batch);
}

double median(std::vector<double> v) {
  std::ranges::sort(v);
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Runs every set-up `rounds` times in rotating order and prints the medians and ratios.
template <class Optimizer>
void compare(const Optimizer& opt, const fashion_mnist& train, int ranks, int rounds, int steps, std::size_t batch) {
  ddp::data::loader loader(train, batch, &fashion_mnist::collate);
  auto make_states = [&](int n, int world) {
    std::vector<replica_state> s;
    for (int r = 0; r < n; ++r) {
      // Rank r of `world`: the distributed sampler's share of epoch 0, as the trainer would draw it.
      auto indices = ddp::sampler::distributed<>::indices(train.size(), r % world, world, 1, 0);
      indices.resize(std::min(indices.size(), static_cast<std::size_t>(steps) * batch));
      s.push_back({fmnist::make_model(1), loader.batches(indices).to_vector()});
    }
    return s;
  };
  auto single = make_states(1, 1), parallel = make_states(ranks, ranks), sharded = make_states(ranks, ranks),
       independent = make_states(ranks, 1);

  struct setup {
    std::string name;
    std::vector<double> rates;
  };
  const std::string n = std::to_string(ranks);
  std::vector<setup> setups{{"1 rank", {}}, {n + " ranks", {}}, {n + " sharded", {}}, {n + " x 1 rank", {}}};
  auto run = [&](std::size_t which) {
    if (which == 0) return run_world<trainer_for<Optimizer>>(single, steps, batch, opt);
    if (which == 1) return run_world<trainer_for<Optimizer>>(parallel, steps, batch, opt);
    if (which == 2) return run_world<trainer_for<Optimizer, ddp::update::sharded>>(sharded, steps, batch, opt);
    return run_independent(independent, steps, batch, opt);
  };
  for (std::size_t i = 0; i < setups.size(); ++i) run(i);  // warm-up: page in, grow the heaps
  for (int r = 0; r < rounds; ++r)
    for (std::size_t k = 0; k < setups.size(); ++k) {
      const std::size_t which = (k + static_cast<std::size_t>(r)) % setups.size();
      setups[which].rates.push_back(run(which));
    }

  const double single_rate = median(setups[0].rates), independent_rate = median(setups[3].rates);
  std::printf("optimizer %s, per-rank batch %zu, %d steps per rank per set-up, %d rounds (medians; min - max):\n",
              Optimizer::name, batch, steps, rounds);
  for (const auto& s : setups) {
    const auto [lo, hi] = std::ranges::minmax(s.rates);
    std::printf("  %-12s %8.0f samples/s   (%.0f - %.0f)\n", s.name.c_str(), median(s.rates), lo, hi);
  }
  std::printf("ceiling (%d independent / 1 rank): %.2fx\n", ranks, independent_rate / single_rate);
  for (std::size_t k : {1, 2}) {
    const double rate = median(setups[k].rates);
    std::printf("speed-up %-11s / 1 rank: %.2fx; ddp efficiency %.0f%% of the ceiling\n", setups[k].name.c_str(),
                rate / single_rate, 100 * rate / independent_rate);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bench::options app{"data-parallel scaling of the Fashion-MNIST model: N ranks against 1 rank and against N "
               "independent single-rank runs, interleaved in one run"};
  int ranks = 2, rounds = 15, steps = 120;
  std::size_t batch = 64;
  std::string data_dir(fashion_mnist::default_directory), optimizer = "sgd";
  app.add("--ranks", ranks, "ranks of the data-parallel set-up", 2, 64);
  app.add("--rounds", rounds, "rounds; each runs every set-up once, in rotating order", 1);
  app.add("--steps", steps, "training steps per rank in each set-up of a round", 1);
  app.add("--batch", batch, "batch per rank", 2, 60000);
  app.add("--optimizer", optimizer, "optimizer: sgd (momentum 0.9) or adamw", {"sgd", "adamw"});
  app.add("--data-dir", data_dir, "directory with the Fashion-MNIST .gz files");
  if (auto exit_code = app.parse(argc, argv)) return *exit_code;
  std::printf("# command: %s   (%u hardware threads)\n", bench::command_line(argc, argv).c_str(),
              std::thread::hardware_concurrency());

  const auto train = fashion_mnist::load(fashion_mnist::split::train, data_dir);
  if (batch > train.size() / static_cast<std::size_t>(ranks)) {
    std::fprintf(stderr, "rank_scaling: --batch %zu is more than one rank's share of the %zu training images at "
                 "--ranks %d; use --batch %zu or less\n", batch, train.size(), ranks,
                 train.size() / static_cast<std::size_t>(ranks));
    return 1;
  }
  if (optimizer == "sgd")
    compare(sgd, train, ranks, rounds, steps, batch);
  else
    compare(adamw, train, ranks, rounds, steps, batch);
}
