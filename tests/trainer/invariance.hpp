#pragma once
// One rank of a run under a reduction policy with each step's global batch dealt as virtual
// shards (ddp::sampler::virtual_shards): the in-process and MPI invariance tests share it.
#include <cstring>
#include <filesystem>
#include <type_traits>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/host/half.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/nn/batch_norm.hpp"
#include "ddp/nn/residual.hpp"
#include "ddp/nn/cross_entropy.hpp"
#include "ddp/nn/dropout.hpp"
#include "ddp/sampler/virtual_shards.hpp"
#include "trainer/test_model.hpp"

namespace invariance {

inline constexpr std::size_t shards = 8, per_shard = 5, steps = 6;

// A model with batch norm: each virtual shard normalises with its own statistics, and the
// running statistics take every shard's in shard order.
using bn_mlp = ddp::nn::sequential<ddp::nn::linear, ddp::nn::batch_norm, ddp::nn::relu, ddp::nn::linear>;
inline bn_mlp make_bn_mlp(std::uint64_t seed) {
  return bn_mlp(ddp::nn::linear(test::in_features, 16, seed), ddp::nn::batch_norm(16), ddp::nn::relu(),
                ddp::nn::linear(16, test::classes, seed + 1));
}
inline bn_mlp& underlying(bn_mlp& m) { return m; }
// Batch norm inside a residual branch: the branch passes its layers' deferred updates on.
using residual_bn_mlp =
    ddp::nn::sequential<ddp::nn::linear, ddp::nn::residual<ddp::nn::batch_norm, ddp::nn::relu, ddp::nn::linear>,
                        ddp::nn::relu, ddp::nn::linear>;
inline residual_bn_mlp make_residual_bn_mlp(std::uint64_t seed) {
  return residual_bn_mlp(ddp::nn::linear(test::in_features, 16, seed),
                         ddp::nn::residual(ddp::nn::batch_norm(16), ddp::nn::relu(), ddp::nn::linear(16, 16, seed + 1)),
                         ddp::nn::relu(), ddp::nn::linear(16, test::classes, seed + 2));
}
inline residual_bn_mlp& underlying(residual_bn_mlp& m) { return m; }
// Two batch norms, the first frozen (fine-tuning): it records nothing, the second its statistics.
// The same rank given to every replica's dropout: the masks differ by world size only through
// which forward of a rank runs a shard, unless the trainer keys them by the shard.
using dropout_mlp = ddp::nn::sequential<ddp::nn::linear, ddp::nn::relu, ddp::nn::dropout, ddp::nn::linear>;
inline dropout_mlp make_dropout_mlp(std::uint64_t seed) {
  return dropout_mlp(ddp::nn::linear(test::in_features, 16, seed), ddp::nn::relu(), ddp::nn::dropout(0.5f, seed, 0),
                     ddp::nn::linear(16, test::classes, seed + 1));
}
inline dropout_mlp& underlying(dropout_mlp& m) { return m; }

using frozen_bn_mlp = ddp::nn::sequential<ddp::nn::linear, ddp::nn::batch_norm, ddp::nn::relu, ddp::nn::linear,
                                          ddp::nn::batch_norm, ddp::nn::relu, ddp::nn::linear>;
inline frozen_bn_mlp make_frozen_bn_mlp(std::uint64_t seed) {
  frozen_bn_mlp m(ddp::nn::linear(test::in_features, 16, seed), ddp::nn::batch_norm(16), ddp::nn::relu(),
                  ddp::nn::linear(16, 16, seed + 1), ddp::nn::batch_norm(16), ddp::nn::relu(),
                  ddp::nn::linear(16, test::classes, seed + 2));
  m.layer<1>().set_mode(ddp::nn::batch_norm::mode::frozen);
  return m;
}
inline frozen_bn_mlp& underlying(frozen_bn_mlp& m) { return m; }
using test::underlying;

// Every parameter's values, 16-bit ones widened (exactly), then every buffer's bytes.
template <class Model>
std::vector<float> parameters_of(Model& m) {
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
  for (auto& b : m.buffers()) {
    const std::size_t at = all.size();
    all.resize(at + (b.value.bytes() + sizeof(float) - 1) / sizeof(float));
    std::memcpy(all.data() + at, b.value.data, b.value.bytes());
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
  const std::uint64_t seed = run.from ? 99 : 7;  // a resumed run's values come from the checkpoint
  Module model = [&] {
    if constexpr (std::is_same_v<Module, bn_mlp>) {
      return make_bn_mlp(seed);
    } else if constexpr (std::is_same_v<Module, residual_bn_mlp>) {
      return make_residual_bn_mlp(seed);
    } else if constexpr (std::is_same_v<Module, frozen_bn_mlp>) {
      return make_frozen_bn_mlp(seed);
    } else if constexpr (std::is_same_v<Module, dropout_mlp>) {
      return make_dropout_mlp(seed);
    } else {
      test::mlp mlp = test::make_mlp(seed);
      if (run.precision != ddp::dtype::f32) mlp.cast_parameters(run.precision);
      return Module(std::move(mlp));
    }
  }();
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
  trainer.gather_parameters();  // update::fully_sharded: the module holds its parameters only when gathered
  return parameters_of(underlying(model));
}

// Every rank's parameters at `world` in-process ranks.
template <class Reduction, class Update, class Module = test::mlp, class Optimizer>
std::vector<std::vector<float>> train(int world, Optimizer opt, const run_options& run = {}) {
  return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
    return train_rank<Reduction, Update, Optimizer, ddp::inproc::communicator, Module>(comm, opt, run);
  });
}

}  // namespace invariance
