#pragma once
// The equivalence run shared by the in-process and MPI tests: one process on the global batch
// (the reference) and one rank's part of the data-parallel run.
#include "ddp/ddp.hpp"
#include "ddp/host/device.hpp"
#include "trainer/test_model.hpp"

namespace equivalence {

constexpr std::size_t per_rank_batch = 8;
constexpr int steps = 3;
constexpr std::uint64_t seed = 42;
const ddp::optim::sgd sgd{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-3f, .nesterov = false};
const ddp::optim::adamw adamw{.lr = 1e-2f, .weight_decay = 1e-2f};

template <class Optimizer>
const Optimizer& settings() {
  if constexpr (std::is_same_v<Optimizer, ddp::optim::sgd>) return sgd;
  else return adamw;
}

struct run_result {
  std::vector<std::vector<float>> params;
  std::vector<float> running_mean;  // of the tracked_affine layer
};

inline run_result reference(int world) {
  auto model = test::make_mlp(seed);
  test::reference_sgd opt(model, sgd);
  for (int s = 0; s < steps; ++s) {
    auto b = test::make_batch(per_rank_batch * static_cast<std::size_t>(world), 1000 + s);
    auto logits = model.forward(b.x);
    auto ce = ddp::nn::softmax_cross_entropy(logits, b.y);
    model.backward(ce.grad, ddp::ready_sink{});
    opt.step();
  }
  auto rm = model.layer<1>().running_mean();
  return {test::parameter_values(model), {rm.begin(), rm.end()}};
}

enum class shape { one_forward, two_forwards, two_micro_batches };

// One micro-batch: `forwards` forwards over equal parts, then backwards innermost first.
template <class Replica>
void forward_backward(Replica& r, const test::batch& b, int forwards) {
  const std::size_t part = b.x.rows / static_cast<std::size_t>(forwards);
  std::vector<ddp::nn::matrix> grads;
  for (int f = 0; f < forwards; ++f) {
    auto piece = b.rows(part * f, part * (f + 1));
    auto ce = ddp::nn::softmax_cross_entropy(r.forward(piece.x), piece.y);
    for (auto& g : ce.grad.data) g /= static_cast<float>(forwards);  // loss = mean of the parts
    grads.push_back(std::move(ce.grad));
  }
  for (int f = forwards - 1; f >= 0; --f) r.backward(grads[static_cast<std::size_t>(f)]);
}

// One rank's part of the distributed run, on any host communicator. Small buckets: several per
// step, none a multiple of the world size (sharded updates pad them). `overlap`: the optimizer
// overlapped with the reductions (trainer.overlap_optimizer).
template <class Sync, class Unused, class Comm, class Update = ddp::update::replicated,
          class Optimizer = ddp::optim::sgd, class Module = test::mlp, class Hook = ddp::comm_hook::none>
run_result run_rank(Comm& comm, shape how, bool overlap = false) {
  const int world = comm.size();
  Module model(test::make_mlp(seed + static_cast<std::uint64_t>(comm.rank())));  // rank 0's wins
  ddp::host::device dev;
  ddp::trainer<Module, Sync, Unused, Update, Optimizer, Hook, ddp::bucket_cap<256>, ddp::use_communicator<Comm>> trainer(
      model, comm, dev, settings<Optimizer>());
  trainer.overlap_optimizer(overlap);
  for (int s = 0; s < steps; ++s) {
    auto global = test::make_batch(per_rank_batch * static_cast<std::size_t>(world), 1000 + s);
    const std::size_t r = static_cast<std::size_t>(comm.rank());
    auto mine = global.rows(r * per_rank_batch, (r + 1) * per_rank_batch);
    if (how == shape::two_micro_batches) {
      const std::size_t half = per_rank_batch / 2;
      auto first = mine.rows(0, half), second = mine.rows(half, per_rank_batch);
      trainer.accumulate([&](auto& rep) { forward_backward(rep, first, 1); });
      trainer.step([&](auto& rep) { forward_backward(rep, second, 1); });
    } else {
      trainer.step([&](auto& rep) { forward_backward(rep, mine, how == shape::two_forwards ? 2 : 1); });
    }
  }
  trainer.gather_parameters();  // update::fully_sharded: the module holds its parameters only when gathered
  auto rm = test::underlying(model).template layer<1>().running_mean();
  return run_result{test::parameter_values(model), {rm.begin(), rm.end()}};
}

// Join: rank r has 2 + r batches of its own, then joins; in step k the ranks that still have a
// batch train on it. The reference is one process on the concatenation of step k's batches.
inline test::batch join_batch(int rank, int step) {
  return test::make_batch(per_rank_batch, 5000 + static_cast<std::uint64_t>(100 * step + rank));
}
inline int join_steps_of(int rank) { return 2 + rank; }

inline std::vector<std::vector<float>> join_reference(int world) {
  auto model = test::make_mlp(seed);
  test::reference_sgd opt(model, sgd);
  for (int k = 0; k < join_steps_of(world - 1); ++k) {
    std::vector<test::batch> parts;
    for (int r = 0; r < world; ++r)
      if (k < join_steps_of(r)) parts.push_back(join_batch(r, k));
    test::batch all{ddp::nn::matrix(per_rank_batch * parts.size(), test::in_features), {}};
    for (std::size_t p = 0; p < parts.size(); ++p) {
      std::copy(parts[p].x.data.begin(), parts[p].x.data.end(),
                all.x.data.begin() + static_cast<std::ptrdiff_t>(p * parts[p].x.data.size()));
      all.y.insert(all.y.end(), parts[p].y.begin(), parts[p].y.end());
    }
    model.backward(ddp::nn::softmax_cross_entropy(model.forward(all.x), all.y).grad, ddp::ready_sink{});
    opt.step();
  }
  return test::parameter_values(model);
}

// One rank of the join run: its parameters and how many steps it shadowed.
template <class Sync, class Unused, class Comm, class Update = ddp::update::replicated>
std::pair<std::vector<std::vector<float>>, std::size_t> run_join_rank(Comm& comm) {
  auto model = test::make_mlp(seed + static_cast<std::uint64_t>(comm.rank()));
  ddp::host::device dev;
  ddp::trainer<test::mlp, Sync, Unused, Update, ddp::bucket_cap<256>, ddp::use_communicator<Comm>> trainer(
      model, comm, dev, sgd);
  for (int k = 0; k < join_steps_of(comm.rank()); ++k) {
    const auto b = join_batch(comm.rank(), k);
    trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
  }
  const std::size_t shadowed = trainer.join();
  return {test::parameter_values(model), shadowed};
}

}  // namespace equivalence
