// Update strategies that shard more than the optimizer state. update::sharded_gradients (ZeRO
// stage 2) gives the bits of update::replicated in every set-up that sharded covers, moves the
// bytes of update::sharded, and holds the memory its formula says: this rank's shard of the
// gradients, the full gradients of a few buckets only while they reduce.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/host/linalg.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/policy/powersgd.hpp"
#include "trainer/counting_communicator.hpp"
#include "trainer/deep_run.hpp"
#include "trainer/equivalence.hpp"
#include "trainer/test_model.hpp"

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

}  // namespace

TEST_CASE_TEMPLATE("update::sharded_gradients leaves every rank with bitwise the parameters of update::replicated",
                   Unused, ddp::unused_params::forbid, ddp::unused_params::detect_each_step) {
  using ddp::update::replicated, ddp::update::sharded_gradients;
  for (int world : {1, 2, 3, 4})
    for (auto how : {shape::one_forward, shape::two_forwards, shape::two_micro_batches}) {
      CAPTURE(world);
      CAPTURE(static_cast<int>(how));
      const auto rep = train<replicated, Unused, ddp::optim::sgd>(world, how);
      const auto zero2 = train<sharded_gradients, Unused, ddp::optim::sgd>(world, how);
      const auto rep_a = train<replicated, Unused, ddp::optim::adamw>(world, how);
      const auto zero2_a = train<sharded_gradients, Unused, ddp::optim::adamw>(world, how);
      for (std::size_t r = 0; r < rep.size(); ++r) {
        CHECK(zero2[r].params == rep[r].params);
        CHECK(zero2_a[r].params == rep_a[r].params);
        CHECK(zero2[r].running_mean == rep[r].running_mean);
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
  auto train_deep = [&]<class Update, class... More>(int world, test::deep_run_options o) {
    return test::params_of(test::train_deep<Update, ddp::optim::adamw, More...>(world, o));
  };
  using ddp::update::sharded, ddp::update::sharded_gradients;
  for (int world : {2, 3}) {
    CAPTURE(world);
    using psgd = ddp::comm_hook::powersgd<1>;
    const test::deep_run_options micro{.micro_batches = true};
    CHECK(train_deep.template operator()<sharded, psgd>(world, micro) ==
          train_deep.template operator()<sharded_gradients, psgd>(world, micro));
    CHECK(train_deep.template operator()<sharded, ddp::comm_hook::fp16>(world, {}) ==
          train_deep.template operator()<sharded_gradients, ddp::comm_hook::fp16>(world, {}));
    CHECK(train_deep.template operator()<sharded, ddp::unused_params::static_graph>(world, micro) ==
          train_deep.template operator()<sharded_gradients, ddp::unused_params::static_graph>(world, micro));
    CHECK(train_deep.template operator()<sharded>(world, {.micro_batches = true, .bf16 = true}) ==
          train_deep.template operator()<sharded_gradients>(world, {.micro_batches = true, .bf16 = true}));
    CHECK(train_deep.template operator()<sharded>(world, {.clip = 0.05f}) ==
          train_deep.template operator()<sharded_gradients>(world, {.clip = 0.05f}));
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
}

TEST_CASE("update::sharded_gradients holds this rank's shard of the gradients, and the full gradients of a few "
          "buckets only while they reduce, in memory it keeps for the next step") {
  constexpr int world = 4;
  constexpr std::size_t in_flight = ddp::update::sharded_gradients::gradient_buckets_in_flight;
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
