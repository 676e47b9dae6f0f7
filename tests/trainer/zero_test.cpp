// Update strategies that shard more than the optimizer state. update::sharded_gradients (ZeRO
// stage 2) gives the bits of update::replicated in every set-up that sharded covers, moves the
// bytes of update::sharded, and holds the memory its formula says: this rank's shard of the
// gradients, the full gradients of a few buckets only while they reduce. update::fully_sharded
// (ZeRO stage 3) gives the same bits, moves one and a half all_reduces' bytes, and keeps only its
// shard of the parameters too, gathering a few layers' at a time.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/host/linalg.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/policy/powersgd.hpp"
#include "support/sanitized.hpp"
#include "trainer/counting_communicator.hpp"
#include "trainer/deep_run.hpp"
#include "trainer/equivalence.hpp"
#include "trainer/test_model.hpp"

namespace trainer_zero_test {

namespace {

using namespace equivalence;
using ddp::inproc::communicator;
using sync_once = ddp::buffer_sync::broadcast_once_per_step;

template <class Update, class Unused, class Optimizer, class Hook = ddp::comm_hook::none>
std::vector<run_result> train(int world, shape how) {
  return ddp::inproc::launch(world, [&](communicator& comm) {
    return run_rank<sync_once, Unused, communicator, Update, Optimizer, test::mlp, Hook>(comm, how);
  });
}

using ddp::nn::linear, ddp::nn::relu;
using test::deep_mlp, test::make_deep_mlp;

// Floats of a bucket of n under a policy that cuts it into equal shards of 16-float multiples.
std::size_t shard_of(std::size_t n, int world) {
  const auto w = static_cast<std::size_t>(world);
  return (n + w * 16 - 1) / (w * 16) * 16;
}

// The full gradients of the k largest buckets (padded, the last with its control floats: the
// micro-batch count and unused_params::forbid's flag), in floats.
std::size_t largest_held(const std::vector<std::size_t>& buckets, int world, std::size_t k) {
  std::vector<std::size_t> held;
  for (std::size_t b = 0; b < buckets.size(); ++b)
    held.push_back(world * shard_of(buckets[b], world) + (b + 1 == buckets.size() ? 2 : 0));
  std::sort(held.begin(), held.end(), std::greater<>());
  held.resize(std::min(k, held.size()));
  std::size_t sum = 0;
  for (const auto h : held) sum += h;
  return sum;
}


// Each rank's parameters after the ten-bucket model's run (tests/trainer/deep_run.hpp) under Update, AdamW
// and More.
template <class Update, class... More>
std::vector<std::vector<std::vector<float>>> deep_params(int world, test::deep_run_options o) {
  return test::params_of(test::train_deep<Update, ddp::optim::adamw, More...>(world, o));
}

// Update strategies A and B give the same bits on the ten-bucket model with PowerSGD, fp16 and
// static_graph (over micro-batches where they apply), and with clipping.
template <class A, class B>
void check_same_deep_bits(int world) {
  using psgd = ddp::comm_hook::powersgd<1>;
  using ddp::comm_hook::fp16, ddp::unused_params::static_graph;
  const test::deep_run_options micro{.micro_batches = true};
  CHECK(deep_params<A, psgd>(world, micro) == deep_params<B, psgd>(world, micro));
  CHECK(deep_params<A, fp16>(world, {}) == deep_params<B, fp16>(world, {}));
  CHECK(deep_params<A, static_graph>(world, micro) == deep_params<B, static_graph>(world, micro));
  CHECK(deep_params<A>(world, {.clip = 0.05f}) == deep_params<B>(world, {.clip = 0.05f}));
}

}  // namespace

TEST_CASE_TEMPLATE("update::sharded_gradients leaves every rank with bitwise the parameters of update::replicated",
                   Unused, ddp::unused_params::forbid, ddp::unused_params::detect_each_step) {
  using ddp::update::replicated, ddp::update::sharded_gradients, ddp::update::fully_sharded;
  for (int world : {1, 2, 3, 4})
    for (auto how : {shape::one_forward, shape::two_forwards, shape::two_micro_batches}) {
      CAPTURE(world);
      CAPTURE(static_cast<int>(how));
      const auto rep = train<replicated, Unused, ddp::optim::sgd>(world, how);
      const auto zero2 = train<sharded_gradients, Unused, ddp::optim::sgd>(world, how);
      const auto rep_a = train<replicated, Unused, ddp::optim::adamw>(world, how);
      const auto zero2_a = train<sharded_gradients, Unused, ddp::optim::adamw>(world, how);
      const auto zero3 = train<fully_sharded, Unused, ddp::optim::sgd>(world, how);
      const auto zero3_a = train<fully_sharded, Unused, ddp::optim::adamw>(world, how);
      for (std::size_t r = 0; r < rep.size(); ++r) {
        CHECK(zero2[r].params == rep[r].params);
        CHECK(zero2_a[r].params == rep_a[r].params);
        CHECK(zero2[r].running_mean == rep[r].running_mean);
        CHECK(zero3[r].params == rep[r].params);
        CHECK(zero3_a[r].params == rep_a[r].params);
        CHECK(zero3[r].running_mean == rep[r].running_mean);
      }
    }
}

TEST_CASE("update::sharded_gradients with a communication hook and with Join gives update::sharded's bits") {
  using ddp::update::sharded, ddp::update::sharded_gradients, ddp::unused_params::forbid;
  for (int world : {2, 3}) {
    CAPTURE(world);
    const auto zero1 = train<sharded, forbid, ddp::optim::sgd, ddp::comm_hook::bf16>(world, shape::two_micro_batches);
    const auto zero2 =
        train<sharded_gradients, forbid, ddp::optim::sgd, ddp::comm_hook::bf16>(world, shape::two_micro_batches);
    for (std::size_t r = 0; r < zero1.size(); ++r) CHECK(zero2[r].params == zero1[r].params);

    auto join = [&]<class Update>() {
      return ddp::inproc::launch(world, [&](communicator& comm) { return run_join_rank<sync_once, forbid, communicator, Update>(comm); });
    };
    const auto rep = join.template operator()<ddp::update::replicated>();
    const auto joined = join.template operator()<sharded_gradients>();
    for (std::size_t r = 0; r < rep.size(); ++r) {
      CHECK(joined[r].first == rep[r].first);
      CHECK(joined[r].second == rep[r].second);
    }
  }
}

TEST_CASE("update::sharded_gradients gives update::sharded's bits with PowerSGD, fp16, static_graph, bf16 parameters, "
          "clipping and micro-batches, and around backwards outside its steps") {
  using ddp::update::sharded, ddp::update::sharded_gradients;
  for (int world : {2, 3}) {
    CAPTURE(world);
    check_same_deep_bits<sharded, sharded_gradients>(world);
    CHECK(deep_params<sharded>(world, {.micro_batches = true, .bf16 = true}) ==
          deep_params<sharded_gradients>(world, {.micro_batches = true, .bf16 = true}));
  }
  // A backward outside the trainer's steps (a GAN's discriminator in the generator's step) holds
  // its buckets until the next step reduces them, or until zero_gradients().
  auto gan = [&]<class Update>(bool zero) {
    return ddp::inproc::launch(2, [&](communicator& comm) {
      auto model = make_deep_mlp();
      ddp::host::device dev;
      ddp::trainer<deep_mlp, Update, ddp::optim::adamw, ddp::bucket_cap<2400>> trainer(model, comm, dev, adamw);
      for (int s = 0; s < 3; ++s) {
        const auto b = test::make_batch(8, 300 + static_cast<std::uint64_t>(10 * s + comm.rank()));
        trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
        model.backward(ddp::nn::softmax_cross_entropy(model.forward(b.x), b.y).grad, ddp::ready_sink{});
        if (zero) trainer.zero_gradients();
      }
      return test::parameter_values(model);
    });
  };
  CHECK(gan.template operator()<sharded>(true) == gan.template operator()<sharded_gradients>(true));
  CHECK(gan.template operator()<sharded>(false) == gan.template operator()<sharded_gradients>(false));
}

TEST_CASE("update::sharded_gradients: a step that throws after its backward leaves the module its gradients when the "
          "trainer goes, and a new trainer trains it") {
  auto model = make_deep_mlp();
  CHECK_THROWS_WITH(ddp::inproc::launch(1,
                                        [&](communicator& comm) {
                                          ddp::host::device dev;
                                          ddp::trainer<deep_mlp, ddp::update::sharded_gradients, ddp::bucket_cap<2400>>
                                              trainer(model, comm, dev, sgd);
                                          const auto b = test::make_batch(8, 7);
                                          trainer.step([&](auto& r) {
                                            r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad);
                                            throw std::runtime_error("a failure after backward");
                                          });
                                          return 0;
                                        }),
                    doctest::Contains("a failure after backward"));
  // Buckets completed and released, and buckets still held, when the step failed: every gradient
  // is back in the module's own storage.
  for (const auto g : {model.layer<0>().params()[0].grad(), model.layer<18>().params()[0].grad()}) CHECK(g.data() != nullptr);
  ddp::inproc::launch(1, [&](communicator& comm) {
    ddp::host::device dev;
    ddp::trainer<deep_mlp, ddp::update::sharded_gradients, ddp::bucket_cap<2400>> again(model, comm, dev, sgd);
    const auto b = test::make_batch(8, 8);
    again.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    CHECK(again.steps() == 1);
    return 0;
  });
}

TEST_CASE("bytes per step: update::sharded_gradients moves update::sharded's bytes, one all_reduce's over padded buckets") {
  constexpr int world = 4;
  struct counted {
    test::collective_bytes step;
    std::vector<std::size_t> buckets;
  };
  auto run = [&]<class Update>() {
    return ddp::inproc::launch(world, [&](communicator& inner) {
      test::counting_communicator<communicator> comm(inner);
      auto model = test::make_mlp(seed);
      ddp::host::device dev;
      ddp::trainer<test::mlp, ddp::buffer_sync::none, ddp::unused_params::unchecked, Update, ddp::bucket_cap<256>,
                   ddp::use_communicator<test::counting_communicator<communicator>>>
          trainer(model, comm, dev, sgd);
      const auto b = test::make_batch(per_rank_batch, 70 + static_cast<std::uint64_t>(inner.rank()));
      const auto before = comm.bytes();
      for (int s = 0; s < 2; ++s)
        trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
      const auto moved = comm.bytes() - before;
      return counted{{moved.all_reduce / 2, moved.reduce_scatter / 2, moved.all_gather / 2, moved.broadcast / 2},
                     trainer.bucket_sizes()};
    })[0];
  };
  const auto rep = run.template operator()<ddp::update::replicated>();
  const auto zero1 = run.template operator()<ddp::update::sharded>();
  const auto zero2 = run.template operator()<ddp::update::sharded_gradients>();
  const auto zero3 = run.template operator()<ddp::update::fully_sharded>();
  REQUIRE(rep.buckets.size() > 3);
  const double ring = 3.0 / 4.0, control = 4.0;  // the micro-batch count, one float
  double numel = 0, padded = 0;
  for (const auto n : rep.buckets) numel += 4.0 * static_cast<double>(n), padded += 4.0 * world * shard_of(n, world);
  CHECK(rep.step.all_reduce == doctest::Approx(2 * ring * (numel + control)));
  CHECK(rep.step.reduce_scatter + rep.step.all_gather + rep.step.broadcast == 0);
  for (const auto& z : {zero1, zero2}) {
    CHECK(z.step.reduce_scatter == doctest::Approx(ring * padded));
    CHECK(z.step.all_gather == doctest::Approx(ring * padded));
    CHECK(z.step.all_reduce == doctest::Approx(2 * ring * control));
  }
  CHECK(zero2.step.total() == zero1.step.total());
  // ZeRO-3: the parameters gathered twice (forward, backward), the gradients reduce-scattered once,
  // nothing gathered after the update: one and a half all_reduces over the padded buckets.
  CHECK(zero3.step.all_gather == doctest::Approx(2 * ring * padded));
  CHECK(zero3.step.reduce_scatter == doctest::Approx(ring * padded));
  CHECK(zero3.step.all_reduce == doctest::Approx(2 * ring * control));
  CHECK(zero3.step.broadcast == 0);
  const double ratio = static_cast<double>(zero3.step.total()) / static_cast<double>(rep.step.total());
  CHECK(ratio >= 1.5 * numel / (numel + control) - 1e-9);
  CHECK(ratio <= 1.5 * padded / numel);
}

TEST_CASE("update::sharded_gradients holds this rank's shard of the gradients, and the full gradients of a few "
          "buckets only while they reduce, in memory it keeps for the next step") {
  constexpr int world = 4;
  constexpr std::size_t in_flight = ddp::update::sharded_gradients::memory.gradient_buckets_in_flight;
  struct measured {
    ddp::memory_held held, after_steps;
    std::size_t device_in_use = 0, step_peak = 0, parameter_floats = 0;
    std::vector<std::size_t> buckets;
    bool module_gradients_released = false;
  };
  auto run = [&]<class Update>() {
    return ddp::inproc::launch(world, [&](communicator& comm) {
      auto model = make_deep_mlp();
      ddp::host::device dev;
      ddp::trainer<deep_mlp, Update, ddp::optim::adamw, ddp::bucket_cap<2400>> trainer(model, comm, dev, adamw);
      measured m;
      m.held = trainer.memory();
      m.device_in_use = dev.memory_in_use();
      m.buckets = trainer.bucket_sizes();
      for (const ddp::parameter_ref& p : model.parameters()) m.parameter_floats += p.value.numel();
      dev.reset_memory_high_water();
      const auto b = test::make_batch(per_rank_batch, 80 + static_cast<std::uint64_t>(comm.rank()));
      for (int s = 0; s < 3; ++s)
        trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
      m.step_peak = dev.memory_high_water() - m.device_in_use;
      m.module_gradients_released = model.layer<0>().params()[0].grad().data() == nullptr;
      m.after_steps = trainer.memory();
      CHECK(dev.memory_in_use() - m.device_in_use == m.after_steps.total() - m.held.total());
      return m;
    })[0];
  };
  const auto rep = run.template operator()<ddp::update::replicated>();
  const auto zero1 = run.template operator()<ddp::update::sharded>();
  const auto zero2 = run.template operator()<ddp::update::sharded_gradients>();
  std::size_t numel = 0, shards = 0;
  for (const auto n : rep.buckets) numel += n, shards += shard_of(n, world);
  REQUIRE(rep.buckets.size() >= 8);
  // The control floats: the micro-batch count and unused_params::forbid's flag. AdamW keeps two
  // state floats per parameter.
  const std::size_t control = 2, f = sizeof(float), slots = 2;
  // The formula per strategy, in floats: parameters (the module's own, or the gathered copy it is
  // bound into), gradients (bound into the buckets, or this rank's shard), optimizer state.
  CHECK(rep.held.gradients == (numel + control) * f);
  CHECK(rep.held.parameters == rep.parameter_floats * f);  // its buckets align each parameter: numel is a little more
  CHECK(rep.held.optimizer_state == slots * numel * f);
  CHECK(zero1.held.gradients == (world * shards + control) * f);
  CHECK(zero1.held.parameters == world * shards * f);
  CHECK(zero1.held.optimizer_state == slots * shards * f);
  CHECK(zero2.held.gradients == (shards + control) * f);
  CHECK(zero2.held.parameters == world * shards * f);
  CHECK(zero2.held.optimizer_state == slots * shards * f);
  // The device holds all of it but replicated's parameters (the module's own), and the same rest
  // (the buffers' staging) under every strategy.
  const std::size_t rest = zero1.device_in_use - zero1.held.total();
  CHECK(zero2.device_in_use - zero2.held.total() == rest);
  CHECK(rep.device_in_use == rep.held.total() - rep.parameter_floats * f + rest);
  // In a step: replicated and sharded allocate nothing; sharded_gradients lends memory for at most
  // the buckets in flight and the one a layer's backward is filling (a layer spans at most two
  // here) from a pool that it keeps: no more arrays than it used at once.
  CHECK(rep.step_peak == 0);
  CHECK(zero1.step_peak == 0);
  CHECK(rep.after_steps.total() == rep.held.total());
  CHECK(zero1.after_steps.total() == zero1.held.total());
  CHECK(zero2.step_peak > 0);
  CHECK(zero2.after_steps.gradients - zero2.held.gradients == zero2.step_peak);
  CHECK(zero2.step_peak <= (in_flight + 2) * largest_held(rep.buckets, world, 1) * f);
  CHECK(zero2.step_peak * 2 < world * shards * f);  // less than half the full gradients
  CHECK(zero2.module_gradients_released);
  CHECK_FALSE(rep.module_gradients_released);
}

TEST_CASE("update::sharded_gradients lends each bucket memory of its own size: one large layer does not make every "
          "array of the pool large") {
  // One layer holds most of the gradients; with a bucket each, the two buckets in flight are the
  // large one and a small one, not two large ones.
  using one_big_layer = ddp::nn::sequential<linear, relu, linear, relu, linear, relu, linear>;
  constexpr int world = 2;
  struct measured {
    std::size_t first_step = 0, later_steps = 0;
    std::vector<std::size_t> buckets;
  };
  const auto m = ddp::inproc::launch(world, [&](communicator& comm) {
    one_big_layer model(linear(test::in_features, 16, 1), relu(), linear(16, 16, 2), relu(), linear(16, 400, 3), relu(),
                        linear(400, test::classes, 4));
    ddp::host::device dev;
    ddp::trainer<one_big_layer, ddp::update::sharded_gradients, ddp::bucket_cap<2048>> trainer(model, comm, dev, sgd);
    measured out;
    out.buckets = trainer.bucket_sizes();
    const auto in_use = dev.memory_in_use();
    const auto b = test::make_batch(per_rank_batch, 60 + static_cast<std::uint64_t>(comm.rank()));
    auto step = [&] {
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    };
    dev.reset_memory_high_water();
    step();
    out.first_step = dev.memory_high_water() - in_use;
    for (int s = 0; s < 3; ++s) step();
    out.later_steps = dev.memory_high_water() - in_use;
    return out;
  })[0];
  REQUIRE(m.buckets.size() >= 3);
  const std::size_t f = sizeof(float), largest = largest_held(m.buckets, world, 1);
  CHECK(largest_held(m.buckets, world, m.buckets.size()) < 2 * largest);  // the large layer is most of the model
  CHECK(m.first_step > largest * f);
  CHECK(m.first_step <= largest_held(m.buckets, world, m.buckets.size()) * f);  // each array at its own bucket's size
  CHECK(m.later_steps == m.first_step);  // the pool served the first step: later ones allocate nothing
}

TEST_CASE("update::sharded_gradients: a checkpoint resumes bitwise, and the trainer gives the module its gradients "
          "back") {
  const auto dir = std::filesystem::temp_directory_path() / "ddp_zero2_checkpoint";
  std::filesystem::remove_all(dir);
  auto run = [&](int steps, bool save, bool load) {
    return ddp::inproc::launch(2, [&](communicator& comm) {
      auto model = test::make_mlp(seed);
      ddp::host::device dev;
      {
        ddp::trainer<test::mlp, ddp::update::sharded_gradients, ddp::optim::adamw, ddp::bucket_cap<256>> trainer(
            model, comm, dev, adamw);
        if (load) trainer.load(dir);
        for (int s = static_cast<int>(trainer.steps()); s < steps; ++s) {
          const auto b = test::make_batch(per_rank_batch, 90 + static_cast<std::uint64_t>(10 * s + comm.rank()));
          trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
        }
        if (save) trainer.save(dir);
      }
      const auto g = model.layer<0>().params()[0].grad();
      CHECK(g.data() != nullptr);
      CHECK(std::all_of(g.begin(), g.end(), [](float x) { return x == 0.0f; }));
      return test::parameter_values(model);
    });
  };
  const auto whole = run(4, false, false);
  run(2, true, false);
  const auto resumed = run(4, false, true);
  CHECK(resumed == whole);
  std::filesystem::remove_all(dir);
}

TEST_CASE("update::fully_sharded gives update::sharded_gradients' bits with PowerSGD, fp16, static_graph, clipping, "
          "micro-batches and the overlapped optimizer") {
  using ddp::update::sharded_gradients, ddp::update::fully_sharded;
  for (int world : {2, 3}) {
    CAPTURE(world);
    check_same_deep_bits<sharded_gradients, fully_sharded>(world);
    const test::deep_run_options micro{.micro_batches = true};
    const auto plain = deep_params<sharded_gradients>(world, micro);
    CHECK(plain == deep_params<fully_sharded>(world, micro));
    CHECK(plain == deep_params<fully_sharded>(world, {.micro_batches = true, .overlap = true}));
  }
}

namespace {

// About 10 M parameters in 40 layers of 512 x 512 (and their biases): a layer is 1/40 of the model.
// Under the sanitizers a narrower tower: the same 40 buckets and code paths, a 16th of the
// instrumented per-element work (30 s under ThreadSanitizer at full width).
#ifdef DDP_TEST_SANITIZED
constexpr std::size_t tower_width = 128;
#else
constexpr std::size_t tower_width = 512;
#endif
template <std::size_t>
using tower_layer = linear;
template <std::size_t... I>
auto tower_type(std::index_sequence<I...>) -> ddp::nn::sequential<tower_layer<I>...>;
using tower = decltype(tower_type(std::make_index_sequence<40>{}));
template <std::size_t... I>
tower make_tower(std::index_sequence<I...>) {
  return tower(linear(tower_width, tower_width, 500 + I)...);
}

}  // namespace

TEST_CASE("update::fully_sharded at world 4: peak memory of parameters, gradients and AdamW's state at most 0.35 of "
          "update::replicated's, as its formula says") {
  constexpr int world = 4;
  struct measured {
    ddp::memory_held held;
    std::size_t peak = 0, parameter_floats = 0, module_floats = 0;
    std::vector<std::size_t> buckets;
  };
  auto run = [&]<class Update>() {
    return ddp::inproc::launch(world, [&](communicator& comm) {
      auto model = make_tower(std::make_index_sequence<40>{});
      measured m;
      for (const ddp::parameter_ref& p : model.parameters()) m.parameter_floats += p.value.numel();
      ddp::host::device dev;
      ddp::trainer<tower, Update, ddp::optim::adamw, ddp::buffer_sync::none, ddp::unused_params::unchecked,
                   ddp::bucket_cap<(tower_width + 1) * tower_width * 4>>
          trainer(model, comm, dev, adamw);
      m.buckets = trainer.bucket_sizes();
      m.held = trainer.memory();
      dev.reset_memory_high_water();
      ddp::nn::matrix x(2, tower_width);
      for (std::size_t i = 0; i < x.data.size(); ++i) x.data[i] = static_cast<float>((i * 7 + comm.rank()) % 13) / 13.0f;
      const std::vector<int> y{1, 2};
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(x), y).grad); });
      // Everything this rank's trainer holds at its high-water mark; what the module keeps itself.
      m.peak = dev.memory_high_water();
      for (const ddp::parameter_ref& p : model.parameters())
        m.module_floats += (p.value.data ? p.value.numel() : 0) + (p.grad.data ? p.grad.numel() : 0);
      // replicated: the module keeps its values (its gradients are bound into the buckets)
      if (!std::is_same_v<Update, ddp::update::fully_sharded>) m.peak += m.parameter_floats * sizeof(float);
      return m;
    })[0];
  };
  const auto rep = run.template operator()<ddp::update::replicated>();
  const auto zero3 = run.template operator()<ddp::update::fully_sharded>();
  REQUIRE(rep.buckets.size() == 40);  // a bucket per layer
  const std::size_t f = sizeof(float), p = rep.parameter_floats;
#ifndef DDP_TEST_SANITIZED
  CHECK(p > 10'000'000);
#endif
  std::size_t shards = 0;
  for (const auto n : rep.buckets) shards += shard_of(n, world);
  // Held between steps: this rank's shard of the parameters, the gradients and AdamW's two state
  // floats per parameter (the control float beside); the module holds nothing.
  CHECK(zero3.held.parameters == shards * f);
  CHECK(zero3.held.gradients == (shards + 1) * f);
  CHECK(zero3.held.optimizer_state == 2 * shards * f);
  CHECK(zero3.module_floats == 0);
  // In a step, besides: the gathered parameters of a layer and the next one's, and the full
  // gradients of the layer in backward and of the two buckets reducing.
  const std::size_t layer = world * shard_of(rep.buckets.front(), world) + 1;
  CHECK(zero3.peak <= zero3.held.total() + 5 * layer * f);
  CHECK(rep.peak >= 4 * p * f);
  const double ratio = static_cast<double>(zero3.peak) / static_cast<double>(rep.peak);
  MESSAGE("fully_sharded peak / replicated peak at world 4: " << ratio);
  CHECK(ratio <= 0.35);
}

TEST_CASE("update::fully_sharded: a checkpoint resumes bitwise, at the same world size and at another, and the "
          "module gets its parameters back when they were gathered") {
  const auto dir = std::filesystem::temp_directory_path() / "ddp_zero3_checkpoint";
  std::filesystem::remove_all(dir);
  auto run = [&]<class Update>(int world, int steps, bool save, bool load) {
    return ddp::inproc::launch(world, [&](communicator& comm) {
      auto model = test::make_mlp(seed);
      ddp::host::device dev;
      {
        ddp::trainer<test::mlp, Update, ddp::optim::adamw, ddp::bucket_cap<256>> trainer(model, comm, dev, adamw);
        if (load) trainer.load(dir);
        for (int s = static_cast<int>(trainer.steps()); s < steps; ++s) {
          const auto b = test::make_batch(per_rank_batch, 90 + static_cast<std::uint64_t>(10 * s + comm.rank()));
          trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
        }
        if (save) trainer.save(dir);
        trainer.gather_parameters();  // the module takes them back when the trainer goes
      }
      const auto g = model.layer<0>().params()[0].grad();
      CHECK(g.data() != nullptr);
      CHECK(std::all_of(g.begin(), g.end(), [](float x) { return x == 0.0f; }));
      return test::parameter_values(model);
    });
  };
  using ddp::update::replicated, ddp::update::fully_sharded;
  const auto whole = run.template operator()<replicated>(2, 4, false, false);
  CHECK(run.template operator()<fully_sharded>(2, 4, false, false) == whole);
  run.template operator()<fully_sharded>(2, 2, true, false);
  CHECK(run.template operator()<fully_sharded>(2, 4, false, true) == whole);
  // At another world size: the optimizer state's shards re-cut, as replicated resumes from its own.
  const auto at_three = run.template operator()<fully_sharded>(3, 4, false, true);
  std::filesystem::remove_all(dir);
  run.template operator()<replicated>(2, 2, true, false);
  CHECK(at_three == run.template operator()<replicated>(3, 4, false, true));
  std::filesystem::remove_all(dir);
}

TEST_CASE("update::fully_sharded: between steps the module holds no parameter until gathered, and join() and "
          "16-bit parameters are named errors") {
  ddp::inproc::launch(2, [&](communicator& comm) {
    auto model = make_deep_mlp();
    ddp::host::device dev;
    ddp::trainer<deep_mlp, ddp::update::fully_sharded, ddp::bucket_cap<2400>> trainer(model, comm, dev, sgd);
    const auto b = test::make_batch(8, 40 + static_cast<std::uint64_t>(comm.rank()));
    trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    CHECK(model.layer<0>().params()[0].value().data() == nullptr);
    const auto held = trainer.memory().parameters;
    CHECK(trainer.gather_parameters());
    CHECK_FALSE(trainer.gather_parameters());  // gathered already
    CHECK(model.layer<0>().params()[0].value().data() != nullptr);
    CHECK(trainer.memory().parameters > held);
    trainer.release_parameters();
    CHECK(trainer.memory().parameters == held);
    CHECK(model.layer<0>().params()[0].value().data() == nullptr);
    CHECK_THROWS_WITH_AS(trainer.join(), doctest::Contains("update::fully_sharded gathers each layer's parameters"),
                         ddp::error);
  });
  ddp::inproc::launch(2, [&](communicator& comm) {
    auto model = make_deep_mlp();
    model.cast_parameters(ddp::dtype::bf16);
    ddp::host::device dev;
    using zero3 = ddp::trainer<deep_mlp, ddp::update::fully_sharded, ddp::bucket_cap<2400>>;
    CHECK_THROWS_WITH_AS(zero3(model, comm, dev, sgd), doctest::Contains("16-bit parameter value(s)"), ddp::error);
  });
}

namespace {

// test::deep_mlp whose layer hooks are watched: when a layer's forward or backward is about to
// compute (the trainer's hook has returned), how many all_gathers the rank has issued and how many
// parameter floats the trainer holds gathered.
struct watched_deep_mlp : ddp::layer_hooks {
  using input_type = deep_mlp::input_type;
  using output_type = deep_mlp::output_type;
  static constexpr bool reports_gradient_ready = true;
  struct seen {
    char pass;  // 'f' forward, 'b' backward
    std::size_t first, gathers, gathered_floats;
  };

  deep_mlp inner = make_deep_mlp();
  ddp::layer_hooks* trainer = nullptr;
  std::function<std::size_t()> gathers, gathered_floats;
  std::vector<seen> log;

  auto parameters() { return inner.parameters(); }
  auto buffers() { return inner.buffers(); }
  output_type forward(const input_type& x) { return inner.forward(x); }
  void backward(const output_type& g, const ddp::ready_sink& ready) { inner.backward(g, ready); }
  void bind_gradient(std::size_t i, float* p) { inner.bind_gradient(i, p); }
  void bind_parameter(std::size_t i, float* p) { inner.bind_parameter(i, p); }
  void place_gradient(std::size_t i, float* p) { inner.place_gradient(i, p); }
  void place_parameter(std::size_t i, float* p) { inner.place_parameter(i, p); }
  void set_layer_hooks(ddp::layer_hooks* h) {
    trainer = h;
    inner.set_layer_hooks(h ? this : nullptr);
  }
  void before_forward(std::size_t first, std::size_t count) override {
    trainer->before_forward(first, count);
    log.push_back({'f', first, gathers(), gathered_floats()});
  }
  void after_forward(std::size_t first, std::size_t count) override { trainer->after_forward(first, count); }
  void before_backward(std::size_t first, std::size_t count) override {
    trainer->before_backward(first, count);
    log.push_back({'b', first, gathers(), gathered_floats()});
  }
  void after_backward(std::size_t first, std::size_t count) override { trainer->after_backward(first, count); }
};

}  // namespace

TEST_CASE("update::fully_sharded gathers the next layer's parameters while a layer computes, and holds no more than "
          "the buckets of that layer and the next") {
  using counting = test::counting_communicator<communicator>;
  struct watched {
    std::vector<watched_deep_mlp::seen> log;
    std::vector<std::size_t> numels, buckets;
  };
  const auto runs = ddp::inproc::launch(2, [&](communicator& inner) {
    counting comm(inner);
    watched_deep_mlp model;
    ddp::host::device dev;
    ddp::trainer<watched_deep_mlp, ddp::update::fully_sharded, ddp::bucket_cap<2400>, ddp::use_communicator<counting>>
        trainer(model, comm, dev, sgd);
    const std::size_t kept = trainer.memory().parameters / sizeof(float), before = comm.all_gather_calls();
    model.gathers = [&] { return comm.all_gather_calls() - before; };
    model.gathered_floats = [&] { return trainer.memory().parameters / sizeof(float) - kept; };
    const auto b = test::make_batch(8, 20 + static_cast<std::uint64_t>(inner.rank()));
    trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    watched w{model.log, {}, trainer.bucket_sizes()};
    for (const ddp::parameter_ref& p : model.parameters()) w.numels.push_back(p.value.numel());
    return w;
  });
  // Named, not a structured binding: the lambdas below capture them.
  const auto& log = runs[0].log;
  const auto& numels = runs[0].numels;
  const auto& buckets = runs[0].buckets;
  REQUIRE(log.size() == 20);  // ten layers with parameters (a weight and a bias each), forward then backward
  const auto plan = ddp::bucket_cap<2400>{}.plan(numels);
  REQUIRE(plan.buckets.size() == buckets.size());
  REQUIRE(buckets.size() >= 8);
  // The buckets of parameters [lo, hi]: each is gathered once in a pass, as its parameters lie together.
  auto buckets_of = [&](std::size_t lo, std::size_t hi) {
    std::set<std::size_t> seen;
    for (std::size_t i = lo; i <= hi; ++i) seen.insert(plan.slots[i].bucket);
    return seen.size();
  };
  // The first and last parameter of the buckets that layer k's parameters (2k, 2k + 1) lie in.
  auto span_of_layer = [&](std::size_t k) {
    std::size_t lo = numels.size(), hi = 0;
    for (const std::size_t i : {2 * k, 2 * k + 1})
      for (const auto p : plan.buckets[plan.slots[i].bucket]) lo = std::min(lo, p), hi = std::max(hi, p);
    return std::pair(lo, hi);
  };
  const std::size_t last = numels.size() - 1, largest = 2 * shard_of(*std::max_element(buckets.begin(), buckets.end()), 2);
  for (std::size_t k = 0; k < 10; ++k) {
    CAPTURE(k);
    // Forward: layer k (parameters 2k, 2k + 1) computes with the bucket after its own issued.
    CHECK(log[k].pass == 'f');
    CHECK(log[k].first == 2 * k);
    CHECK(log[k].gathers == buckets_of(0, std::min(span_of_layer(k).second + 1, last)));
    CHECK(log[k].gathered_floats <= 3 * largest);
    // Backward, from the last layer: layer 9 - k computes with the layer before it already gathering.
    const std::size_t first = 2 * (9 - k);
    CHECK(log[10 + k].pass == 'b');
    CHECK(log[10 + k].first == first);
    const std::size_t lo = span_of_layer(9 - k).first;
    CHECK(log[10 + k].gathers == buckets.size() + buckets_of(lo == 0 ? 0 : lo - 1, last));
    CHECK(log[10 + k].gathered_floats <= 3 * largest);
  }
}

}  // namespace trainer_zero_test
