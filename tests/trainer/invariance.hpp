#pragma once
// One rank of a run under a reduction policy with each step's global batch dealt as virtual
// shards (ddp::sampler::virtual_shards): the in-process and MPI invariance tests share it.
#include <cstring>
#include <filesystem>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/host/half.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/nn/cross_entropy.hpp"
#include "ddp/sampler/virtual_shards.hpp"
#include "trainer/test_model.hpp"

namespace invariance {

inline constexpr std::size_t shards = 8, per_shard = 5, steps = 6;

// Every parameter's values, 16-bit ones widened (exactly).
inline std::vector<float> parameters_of(test::mlp& m) {
  std::vector<float> all;
  for (auto& p : m.parameters()) {
    const auto n = static_cast<std::size_t>(p.value.numel());
    if (p.value.type == ddp::dtype::f32) {
      const auto* v = static_cast<const float*>(p.value.data);
      all.insert(all.end(), v, v + n);
    } else {
      const auto* h = static_cast<const std::uint16_t*>(p.value.data);
      for (std::size_t i = 0; i < n; ++i)
        all.push_back(p.value.type == ddp::dtype::bf16 ? ddp::host::from_bf16(h[i]) : ddp::host::from_f16(h[i]));
    }
  }
  return all;
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Steps [from, to) of the run, saved at `to` when `save` is set; clipped to `max_norm` when set.
struct run_options {
  std::size_t from = 0, to = steps;
  std::filesystem::path checkpoint;
  bool save = false;
  float max_norm = 0.0f;
  ddp::dtype precision = ddp::dtype::f32;  // the module's parameters (bf16, f16: an f32 master in the trainer)
};

// This rank's parameters after the run's steps, each step's global batch dealt as the reduction's
// virtual shards (`shards` under the plain reduction) over the communicator's ranks.
template <class Reduction, class Update, class Optimizer, class Comm, class Module = test::mlp>
std::vector<float> train_rank(Comm& comm, Optimizer opt, const run_options& run = {}) {
  constexpr std::size_t v = Reduction::virtual_shards ? Reduction::virtual_shards : shards;
  test::mlp mlp = test::make_mlp(run.from ? 99 : 7);  // a resumed run's values come from the checkpoint
  if (run.precision != ddp::dtype::f32) mlp.cast_parameters(run.precision);
  Module model(std::move(mlp));
  ddp::host::device dev;
  ddp::trainer<Module, Reduction, Update, Optimizer, ddp::bucket_cap<512>, ddp::use_communicator<Comm>> trainer(
      model, comm, dev, opt);
  if (run.from) trainer.load(run.checkpoint);
  if (run.max_norm > 0.0f) trainer.clip_gradient_norm(run.max_norm);
  const auto mine = ddp::sampler::virtual_shards(v, comm.rank(), comm.size());
  for (std::size_t t = run.from; t < run.to; ++t) {
    const auto global = test::make_batch(v * per_shard, 100 + t);
    for (std::size_t s = mine.first; s < mine.last; ++s) {
      const auto b = global.rows(mine.begin(s, global.y.size()), mine.end(s, global.y.size()));
      auto f = [&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); };
      if (s + 1 < mine.last) trainer.accumulate(f);
      else trainer.step(f);
    }
  }
  if (run.save) trainer.save(run.checkpoint);
  return parameters_of(test::underlying(model));
}

// Every rank's parameters at `world` in-process ranks.
template <class Reduction, class Update, class Module = test::mlp, class Optimizer>
std::vector<std::vector<float>> train(int world, Optimizer opt, const run_options& run = {}) {
  return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
    return train_rank<Reduction, Update, Optimizer, ddp::inproc::communicator, Module>(comm, opt, run);
  });
}

}  // namespace invariance
