// ddp::nn::gpt through the trainer: N ranks equal one on the global batch (to rounding under the
// plain reduction, bitwise under reduction::invariant), every update strategy gives replicated's
// bits, update::fully_sharded's peak memory at world 4 at nanoGPT's shakespeare_char size, and a short training run on a copy task
// that only a working causal attention learns.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/nn/gpt.hpp"
#include "ddp/sampler/virtual_shards.hpp"
#include "support/relative_error.hpp"
#include "trainer/test_model.hpp"

namespace trainer_gpt_test {

namespace {

using ddp::inproc::communicator;

const ddp::optim::adamw adamw{.lr = 1e-2f, .weight_decay = 1e-2f};
// Two blocks of width 16 (13 KiB each): several 8 KiB buckets.
const ddp::nn::gpt_config tiny{.vocab = 12, .context = 8, .layers = 2, .heads = 2, .width = 16, .seed = 5};

template <class... Policies>
using gpt_trainer = ddp::trainer<ddp::nn::gpt, Policies..., ddp::optim::adamw, ddp::bucket_cap<8192>>;

// Sequences of inputs and their next-token targets.
struct sequences {
  ddp::nn::token_batch x;
  std::vector<std::int32_t> y;

  sequences rows(std::size_t begin, std::size_t end) const {
    const auto t = x.length;
    const auto at = [&](std::size_t s) { return static_cast<std::ptrdiff_t>(s * t); };
    return {{end - begin, t, {x.tokens.begin() + at(begin), x.tokens.begin() + at(end)}},
            {y.begin() + at(begin), y.begin() + at(end)}};
  }
};

sequences random_sequences(std::size_t count, std::size_t length, std::size_t vocab, std::uint64_t seed) {
  ddp::splitmix64 rng(seed);
  sequences s{{count, length, {}}, {}};
  for (std::size_t b = 0; b < count; ++b) {
    std::vector<std::int32_t> row(length + 1);
    for (auto& t : row) t = static_cast<std::int32_t>(rng.below(vocab));
    s.x.tokens.insert(s.x.tokens.end(), row.begin(), row.end() - 1);
    s.y.insert(s.y.end(), row.begin() + 1, row.end());
  }
  return s;
}

auto step_on(const sequences& s) {
  return [&s](auto& r) { r.backward(ddp::nn::sequence_cross_entropy(r.forward(s.x), s.y).grad); };
}

constexpr std::size_t global_sequences = 8, steps = 3;

// Each rank's parameters after `steps` steps on global batches of 8 random sequences: a rank's
// contiguous part of them (in two micro-batches when `micro`), or under reduction::invariant<8>
// its virtual shards, one per sequence.
template <class... Policies>
std::vector<std::vector<std::vector<float>>> train_tiny(int world, bool micro = false) {
  return ddp::inproc::launch(world, [&](communicator& comm) {
    ddp::nn::gpt model(tiny);
    ddp::host::device dev;
    gpt_trainer<Policies...> trainer(model, comm, dev, adamw);
    const auto n = static_cast<std::size_t>(world), r = static_cast<std::size_t>(comm.rank());
    for (std::size_t s = 0; s < steps; ++s) {
      const auto global = random_sequences(global_sequences, tiny.context, tiny.vocab, 100 + s);
      if constexpr ((requires { Policies::virtual_shards; } || ...)) {
        const auto mine = ddp::sampler::virtual_shards(global_sequences, comm.rank(), comm.size());
        for (std::size_t v = mine.first; v < mine.last; ++v) {
          const auto part = global.rows(v, v + 1);
          if (v + 1 < mine.last) trainer.accumulate(step_on(part));
          else trainer.step(step_on(part));
        }
      } else {
        const std::size_t begin = r * global_sequences / n, end = (r + 1) * global_sequences / n;
        if (micro) {
          const auto first = global.rows(begin, begin + 1), rest = global.rows(begin + 1, end);
          trainer.accumulate(step_on(first));
          trainer.step(step_on(rest));
        } else {
          trainer.step(step_on(global.rows(begin, end)));
        }
      }
    }
    trainer.gather_parameters();  // update::fully_sharded: the module holds its parameters only when gathered
    return test::parameter_values(model);
  });
}

}  // namespace

TEST_CASE("ddp::nn::gpt: 2 ranks equal 1 on the global batch, to rounding under the plain reduction and bitwise under "
          "reduction::invariant") {
  using ddp::update::replicated;
  auto one = train_tiny<replicated>(1), two = train_tiny<replicated>(2);
  ddp::nn::gpt untrained(tiny);
  const auto before = test::parameter_values(untrained);
  CHECK(test::max_relative_error(one[0], before) > 1e-3);  // it trained
  CHECK(two[0] == two[1]);
  // The keys' bias adds q.b to every score of a row, which the softmax takes away: its gradient is
  // 0 but for rounding, and AdamW scales that rounding to whole steps. Compared without it.
  for (auto* run : {&one[0], &two[0], &two[1]})
    for (std::size_t k = 0; k < tiny.layers; ++k) {
      auto& bias = (*run)[2 + 12 * k + 3];  // h.k.attn.c_attn.bias: q, k, v
      std::fill(bias.begin() + tiny.width, bias.begin() + 2 * tiny.width, 0.0f);
    }
  for (const auto& rank : two) CHECK(test::max_relative_error(rank, one[0]) <= 1e-5);

  using invariant = ddp::reduction::invariant<global_sequences>;
  const auto exact_one = train_tiny<replicated, invariant>(1), exact_two = train_tiny<replicated, invariant>(2);
  for (const auto& rank : exact_two) CHECK(rank == exact_one[0]);
}

TEST_CASE("ddp::nn::gpt: every update strategy gives update::replicated's bits, with micro-batches too") {
  using namespace ddp::update;
  ddp::nn::gpt model(tiny);
  std::vector<std::size_t> numels;
  for (const ddp::parameter_ref& p : model.parameters()) numels.push_back(p.value.numel());
  REQUIRE(ddp::bucket_cap<8192>{}.plan(numels).buckets.size() >= 3);  // layers gathered and released in turn
  for (int world : {2, 3})
    for (bool micro : {false, true}) {
      CAPTURE(world);
      CAPTURE(micro);
      const auto rep = train_tiny<replicated>(world, micro);
      const auto zero1 = train_tiny<sharded>(world, micro);
      const auto zero2 = train_tiny<sharded_gradients>(world, micro);
      const auto zero3 = train_tiny<fully_sharded>(world, micro);
      for (std::size_t r = 0; r < rep.size(); ++r) {
        CHECK(zero1[r] == rep[r]);
        CHECK(zero2[r] == rep[r]);
        CHECK(zero3[r] == rep[r]);
      }
    }
}

// nanoGPT's shakespeare_char shape (6 layers, 6 heads, width 384, context 256: 10.8 million
// parameters, 41 MiB of them) in 1 MiB buckets: a bucket per weight matrix or two. The peak holds
// no activations (they are the module's, not the trainer's), so one short sequence is a step.
// Under the sanitizers a narrower model of twelve blocks of width 32 (50 KiB each) in 8 KiB
// buckets: the same code paths.
#ifdef DDP_TEST_SANITIZED
const ddp::nn::gpt_config peak_config{.vocab = 16, .context = 8, .layers = 12, .heads = 2, .width = 32, .seed = 9};
using peak_cap = ddp::bucket_cap<8192>;
#else
const ddp::nn::gpt_config peak_config{.vocab = 256, .context = 256, .layers = 6, .heads = 6, .width = 384, .seed = 9};
using peak_cap = ddp::bucket_cap<std::size_t{1} << 20>;
#endif

TEST_CASE("ddp::nn::gpt at nanoGPT's shakespeare_char size under update::fully_sharded at world 4: peak memory of "
          "parameters, gradients and AdamW's state at most 0.35 of update::replicated's") {
  constexpr int world = 4;
  const auto& config = peak_config;
  struct measured {
    ddp::memory_held held;
    std::size_t peak = 0, parameter_floats = 0, module_floats = 0, mlp_half = 0;
    std::vector<std::size_t> buckets;
  };
  auto run = [&]<class Update>() {
    return ddp::inproc::launch(world, [&](communicator& comm) {
      ddp::nn::gpt model(config);
      measured m;
      m.parameter_floats = model.parameter_count();
      const auto refs = model.parameters();
      for (std::size_t i = 2 + 6; i < 2 + 12; ++i) m.mlp_half += refs[i].value.numel();  // block 0's ln_2 and MLP
      ddp::host::device dev;
      ddp::trainer<ddp::nn::gpt, Update, ddp::optim::adamw, peak_cap> trainer(model, comm, dev, adamw);
      m.buckets = trainer.bucket_sizes();
      m.held = trainer.memory();
      dev.reset_memory_high_water();
      const auto b = random_sequences(1, 8, config.vocab, 20 + static_cast<std::uint64_t>(comm.rank()));
      trainer.step(step_on(b));
      m.peak = dev.memory_high_water();
      for (const ddp::parameter_ref& p : model.parameters())
        m.module_floats += (p.value.data ? p.value.numel() : 0) + (p.grad.data ? p.grad.numel() : 0);
      trainer.gather_parameters();
      // replicated: the module keeps its values (its gradients are bound into the buckets)
      if (!std::is_same_v<Update, ddp::update::fully_sharded>) m.peak += m.parameter_floats * sizeof(float);
      return m;
    })[0];
  };
  const auto rep = run.template operator()<ddp::update::replicated>();
  const auto zero3 = run.template operator()<ddp::update::fully_sharded>();
  const std::size_t f = sizeof(float), p = rep.parameter_floats;
#ifndef DDP_TEST_SANITIZED
  CHECK(p > 10'000'000);
#endif
  CHECK(rep.buckets.size() > 2 * config.layers);  // several buckets per block
  CHECK(zero3.module_floats == 0);
  // Held between steps: this rank's shard of each bucket (equal shards of 16-float multiples) of
  // the parameters, the gradients and AdamW's two state floats per parameter (the policies'
  // control floats beside the gradients).
  std::size_t shards = 0;
  for (const auto n : rep.buckets) shards += (n + world * 16 - 1) / (world * 16) * 16;
  CHECK(zero3.held.parameters == shards * f);
  CHECK(zero3.held.gradients >= shards * f);
  CHECK(zero3.held.gradients <= (shards + 2) * f);
  CHECK(zero3.held.optimizer_state == 2 * shards * f);
  CHECK(rep.peak >= 4 * p * f);
  // In a step, besides: the gathered parameters of a half block (the model's layers for the
  // hooks: a block's attention, then its MLP, the larger) and of the next one, the full gradients
  // of the half block in backward and of the buckets reducing (each padded to whole shards).
  const std::size_t largest = *std::ranges::max_element(rep.buckets) + world * 16,
                    half = rep.mlp_half + 4 * world * 16;
  CHECK(zero3.peak <= zero3.held.total() + (3 * half + 3 * largest) * f);
  const double ratio = static_cast<double>(zero3.peak) / static_cast<double>(rep.peak);
  MESSAGE("ddp::nn::gpt (" << p << " parameters, " << rep.buckets.size() << " buckets), fully_sharded peak / "
          "replicated peak at world 4: " << ratio << " (" << zero3.peak / (1 << 20) << " MiB against "
          << rep.peak / (1 << 20) << " MiB)");
  CHECK(ratio <= 0.35);
}

namespace {

// The copy task: 8 random letters of 8, then the same 8 again; inputs are the first 15 tokens,
// targets the next. The 7 targets within the first half cannot be predicted (ln 8 each); the 8
// after can, by attending 7 positions back. A causal model's loss is at best 7/15 ln 8 = 0.970;
// without a working attention it stays near ln 8 = 2.08; a model that sees the future (no mask)
// reads each target off the next input and goes well below 0.97.
sequences copy_task(std::size_t count, std::uint64_t seed) {
  constexpr std::size_t half = 8;
  ddp::splitmix64 rng(seed);
  sequences s{{count, 2 * half - 1, {}}, {}};
  for (std::size_t b = 0; b < count; ++b) {
    std::vector<std::int32_t> row(2 * half);
    for (std::size_t i = 0; i < half; ++i) row[i] = row[i + half] = static_cast<std::int32_t>(rng.below(half));
    s.x.tokens.insert(s.x.tokens.end(), row.begin(), row.end() - 1);
    s.y.insert(s.y.end(), row.begin() + 1, row.end());
  }
  return s;
}

}  // namespace

TEST_CASE("ddp::nn::gpt learns a copy task in 200 steps on 2 ranks, to a validation loss that only a working "
          "causal attention reaches") {
  const ddp::nn::gpt_config config{.vocab = 8, .context = 16, .layers = 2, .heads = 2, .width = 32, .seed = 3};
  const auto losses = ddp::inproc::launch(2, [&](communicator& comm) {
    ddp::nn::gpt model(config);
    ddp::host::device dev;
    gpt_trainer<ddp::update::replicated> trainer(model, comm, dev, ddp::optim::adamw{.lr = 1e-2f, .weight_decay = 0.0f});
    // 200 steps: the loss falls steeply from about 2 to about 1 somewhere between steps 50 and 150,
    // where exactly depends on the kernels' rounding (at step 100 one build stood at 0.99, another
    // at 1.30); by step 200 a working model is past it.
    for (std::uint64_t s = 0; s < 200; ++s) {
      const auto b = copy_task(16, 1000 + 2 * s + static_cast<std::uint64_t>(comm.rank()));
      trainer.step(step_on(b));
    }
    const auto validation = copy_task(64, 7);
    model.eval();
    return ddp::nn::sequence_cross_entropy(model.forward(validation.x), validation.y).loss;
  });
  MESSAGE("copy task: validation loss " << losses[0] << " (causal optimum 0.970, without attention about 2.08)");
  CHECK(losses[0] == losses[1]);
  CHECK(losses[0] < 1.2);
  CHECK(losses[0] > 0.9);
}

}  // namespace trainer_gpt_test
