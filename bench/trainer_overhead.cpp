// What the trainer costs, measured side by side in one run:
//  1. world 1: a step through ddp::trainer against the same module stepped by hand (forward,
//     loss, backward, SGD with momentum, zero gradients), for an MLP of about 1.3M parameters;
//  2. world N (default 2): how much of the gradient reduction ran while backward was still
//     computing, for the default bucket cap and a small one.
//   trainer_overhead [--steps 50] [--repeats 5] [--ranks 2] [--batch 64]

#include <chrono>
#include <cstdio>

#include "collective_sweep.hpp"
#include "options.hpp"
#include "ddp/core/random.hpp"
#include "ddp/ddp.hpp"
#include "ddp/host/kernels.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/nn/cross_entropy.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/relu.hpp"
#include "ddp/nn/sequential.hpp"

namespace {

using model = ddp::nn::sequential<ddp::nn::linear, ddp::nn::relu, ddp::nn::linear, ddp::nn::relu, ddp::nn::linear>;
model make_model() {
  return model(ddp::nn::linear(784, 1024, 1), ddp::nn::relu(), ddp::nn::linear(1024, 512, 2), ddp::nn::relu(),
               ddp::nn::linear(512, 10, 3));
}

struct batch {
  ddp::nn::matrix x;
  std::vector<std::int32_t> y;
};
batch make_batch(std::size_t n, std::uint64_t seed) {
  ddp::splitmix64 rng(seed);
  batch b{ddp::nn::matrix(n, 784), std::vector<std::int32_t>(n)};
  for (auto& v : b.x.data) v = rng.uniform(-1, 1);
  for (auto& y : b.y) y = static_cast<std::int32_t>(rng.below(10));
  return b;
}

const ddp::optim::sgd sgd{.lr = 0.01f, .momentum = 0.9f, .weight_decay = 0.0f};

// The same work without ddp: what a single-process loop does.
class manual_step {
 public:
  explicit manual_step(model& m) : m_(m) {
    for (auto& p : m_.parameters()) {
      params_.push_back(p);
      momentum_.emplace_back(p.value.numel(), 0.0f);
    }
  }
  void operator()(const batch& b) {
    auto ce = ddp::nn::softmax_cross_entropy(m_.forward(b.x), b.y);
    m_.backward(ce.grad, {});
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto v = params_[i].value.as<float>();
      auto g = params_[i].grad.as<float>();
      ddp::host::rule_segment(v.data(), g.data(), momentum_[i].data(), v.size(), sgd.at(1));
      std::fill(g.begin(), g.end(), 0.0f);
    }
  }

 private:
  model& m_;
  std::vector<ddp::parameter_ref> params_;
  std::vector<std::vector<float>> momentum_;
};

template <class Trainer>
void trainer_step(Trainer& t, const batch& b) {
  t.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
}

template <std::size_t Cap>
ddp::overlap_timing overlap_at(int ranks, int steps, std::size_t per_rank_batch) {
  auto per_rank = ddp::inproc::launch(ranks, [&](ddp::inproc::communicator& comm) {
    auto m = make_model();
    ddp::host::device dev;
    ddp::trainer<model, ddp::bucket_cap<Cap>> t(m, comm, dev, sgd);
    const auto b = make_batch(per_rank_batch, 7 + static_cast<std::uint64_t>(comm.rank()));
    trainer_step(t, b);  // warm-up
    ddp::overlap_timing sum;
    for (int s = 0; s < steps; ++s) {
      trainer_step(t, b);
      sum.reduction_seconds += t.last_step_overlap().reduction_seconds;
      sum.overlapped_seconds += t.last_step_overlap().overlapped_seconds;
    }
    return std::pair{sum, t.bucket_count()};
  });
  std::printf("  bucket cap %7zu KiB: %zu bucket(s), reduction %.2f ms/step, %.0f%% of it while backward ran\n",
              Cap >> 10, per_rank[0].second, 1e3 * per_rank[0].first.reduction_seconds / steps,
              100 * per_rank[0].first.fraction());
  return per_rank[0].first;
}

}  // namespace

int main(int argc, char** argv) {
  bench::options app{"per-step cost of ddp::trainer against the same module stepped by hand"};
  int steps = 50, repeats = 5, ranks = 2;
  std::size_t per_rank_batch = 64;
  app.add("--steps", steps, "steps per timed batch", 1);
  app.add("--repeats", repeats, "alternating timed batches of each (best is kept)", 1);
  app.add("--ranks", ranks, "ranks for the overlap measurement", 2, 64);
  app.add("--batch", per_rank_batch, "batch per rank", 1);
  if (auto exit_code = app.parse(argc, argv)) return *exit_code;
  std::printf("# command: %s\n", bench::command_line(argc, argv).c_str());

  const auto b = make_batch(per_rank_batch, 7);
  auto plain_model = make_model();
  manual_step plain(plain_model);
  ddp::inproc::launch(1, [&](ddp::inproc::communicator& comm) {
    auto ddp_model = make_model();
    ddp::host::device dev;
    ddp::trainer<model> t(ddp_model, comm, dev, sgd);
    std::size_t params = 0;
    for (auto& p : ddp_model.parameters()) params += p.value.numel();
    plain(b), trainer_step(t, b);  // warm-up
    double best_plain = 1e30, best_ddp = 1e30;
    for (int r = 0; r < repeats; ++r) {  // alternate, so drifts of the machine hit both
      best_plain = std::min(best_plain, bench::seconds_per_call([&] { plain(b); }, steps, 1));
      best_ddp = std::min(best_ddp, bench::seconds_per_call([&] { trainer_step(t, b); }, steps, 1));
    }
    std::printf("world 1, MLP 784-1024-512-10 (%zu parameters), batch %zu:\n", params, per_rank_batch);
    std::printf("  by hand       %8.3f ms/step\n  ddp::trainer  %8.3f ms/step\n  trainer cost  %+7.2f%%\n",
                1e3 * best_plain, 1e3 * best_ddp, 100 * (best_ddp / best_plain - 1));
  });
  std::printf("world %d, reduction overlapped with backward (in-process ranks share the cores with backward):\n",
              ranks);
  overlap_at<std::size_t{25} << 20>(ranks, steps, per_rank_batch);
  overlap_at<std::size_t{1} << 20>(ranks, steps, per_rank_batch);
  overlap_at<std::size_t{256} << 10>(ranks, steps, per_rank_batch);
}
