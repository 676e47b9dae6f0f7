// The heart of it: K steps of data-parallel training equal K steps of one process on the
// global batch, for every valid policy combination, world size, micro-batching and number of
// forwards per step.
#include <doctest/doctest.h>

#include "ddp/ddp.hpp"
#include "ddp/inproc/launch.hpp"
#include "trainer/equivalence.hpp"
#include "trainer/test_model.hpp"

namespace trainer_equivalence_test {

namespace {

using namespace equivalence;

template <class Sync, class Unused>
std::vector<run_result> distributed(int world, shape how) {
  return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) { return run_rank<Sync, Unused>(comm, how); });
}

template <class Sync, class Unused>
void check_equivalence() {
  for (int world : {1, 2, 3, 4}) {
    const auto ref = reference(world);
    for (auto how : {shape::one_forward, shape::two_forwards, shape::two_micro_batches}) {
      CAPTURE(world);
      CAPTURE(static_cast<int>(how));
      INFO("buffer_sync::", Sync::name, " unused_params::", Unused::name);
      const auto ranks = distributed<Sync, Unused>(world, how);
      for (const auto& rank : ranks) CHECK(test::max_relative_error(rank.params, ref.params) <= 1e-5);
      // Buffers: averaging keeps the running mean equal to the global batch's (its update is
      // linear in the batch mean); broadcasts keep every rank on rank 0's.
      if constexpr (std::is_same_v<Sync, ddp::buffer_sync::average_once_per_step>) {
        if (how == shape::one_forward) {
          std::vector<float> mean(ref.running_mean.size(), 0.0f);
          for (const auto& rank : ranks)
            for (std::size_t c = 0; c < mean.size(); ++c) mean[c] += rank.running_mean[c] / static_cast<float>(world);
          for (std::size_t c = 0; c < mean.size(); ++c) CHECK(mean[c] == doctest::Approx(ref.running_mean[c]).epsilon(1e-5));
        }
      }
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("N ranks equal one process on the global batch", Unused, ddp::unused_params::forbid,
                   ddp::unused_params::detect_each_step, ddp::unused_params::static_graph) {
  SUBCASE("buffer_sync::none") { check_equivalence<ddp::buffer_sync::none, Unused>(); }
  SUBCASE("buffer_sync::broadcast_each_forward") { check_equivalence<ddp::buffer_sync::broadcast_each_forward, Unused>(); }
  SUBCASE("buffer_sync::broadcast_once_per_step") { check_equivalence<ddp::buffer_sync::broadcast_once_per_step, Unused>(); }
  SUBCASE("buffer_sync::average_once_per_step") { check_equivalence<ddp::buffer_sync::average_once_per_step, Unused>(); }
}

TEST_CASE_TEMPLATE("update::sharded leaves every rank with bitwise the parameters of update::replicated", Unused,
                   ddp::unused_params::forbid, ddp::unused_params::detect_each_step, ddp::unused_params::static_graph) {
  using ddp::update::replicated, ddp::update::sharded, ddp::inproc::communicator;
  using sync = ddp::buffer_sync::broadcast_once_per_step;
  auto both = [&]<class Optimizer, class Module>(int world, shape how) {
    auto run = [&]<class Update>() {
      return ddp::inproc::launch(world, [&](communicator& comm) {
        return run_rank<sync, Unused, communicator, Update, Optimizer, Module>(comm, how);
      });
    };
    return std::pair{run.template operator()<replicated>(), run.template operator()<sharded>()};
  };
  for (int world : {1, 2, 3, 4})
    for (auto how : {shape::one_forward, shape::two_micro_batches}) {
      CAPTURE(world);
      CAPTURE(static_cast<int>(how));
      const auto ref = reference(world);
      SUBCASE("sgd, parameters bound into the trainer's memory") {
        const auto [rep, shard] = both.template operator()<ddp::optim::sgd, test::mlp>(world, how);
        for (std::size_t r = 0; r < shard.size(); ++r) {
          CHECK(shard[r].params == rep[r].params);
          CHECK(test::max_relative_error(shard[r].params, ref.params) <= 1e-5);
        }
      }
      SUBCASE("adamw, parameters bound into the trainer's memory") {
        const auto [rep, shard] = both.template operator()<ddp::optim::adamw, test::mlp>(world, how);
        for (std::size_t r = 0; r < shard.size(); ++r) CHECK(shard[r].params == rep[r].params);
      }
      SUBCASE("sgd and adamw, a module that binds nothing") {
        const auto [rep, shard] = both.template operator()<ddp::optim::sgd, test::unbound_mlp>(world, how);
        const auto [rep_a, shard_a] = both.template operator()<ddp::optim::adamw, test::unbound_mlp>(world, how);
        for (std::size_t r = 0; r < shard.size(); ++r) {
          CHECK(shard[r].params == rep[r].params);
          CHECK(shard_a[r].params == rep_a[r].params);
        }
      }
    }
}

TEST_CASE("update::sharded: a parameter no rank used keeps its value and AdamW step count") {
  // Ranks alternate which of them runs the aux branch, and in step 2 none does.
  auto run = [&]<class Update>() {
    return ddp::inproc::launch(3, [&](ddp::inproc::communicator& comm) {
      test::branchy model(5);
      ddp::host::device dev;
      ddp::trainer<test::branchy, ddp::unused_params::detect_each_step, Update, ddp::optim::adamw,
                   ddp::bucket_cap<64>> trainer(model, comm, dev, adamw);
      std::vector<std::vector<std::string>> skipped;
      for (int s = 0; s < 4; ++s) {
        model.use_aux = s != 2 && (s + comm.rank()) % 2 == 0;
        const auto b = test::make_batch(4, static_cast<std::uint64_t>(100 + 10 * s + comm.rank()));
        trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
        skipped.push_back(trainer.skipped_parameters());
      }
      return std::pair{test::parameter_values(model), skipped};
    });
  };
  const auto rep = run.template operator()<ddp::update::replicated>();
  const auto shard = run.template operator()<ddp::update::sharded>();
  for (std::size_t r = 0; r < shard.size(); ++r) {
    CHECK(shard[r].first == rep[r].first);
    CHECK(shard[r].second == rep[r].second);
    CHECK(shard[r].second[2] == std::vector<std::string>{"aux.weight", "aux.bias"});
  }
}

TEST_CASE("a destroyed trainer gives the module its storage back, values and gradients intact") {
  ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(seed);
    ddp::host::device dev;
    std::vector<std::vector<float>> trained;
    {
      ddp::trainer<test::mlp, ddp::update::sharded> trainer(model, comm, dev, sgd);
      const auto b = test::make_batch(per_rank_batch, 7 + static_cast<std::uint64_t>(comm.rank()));
      trainer.step([&](auto& r) { forward_backward(r, b, 1); });
      trainer.step([&](auto& r) { forward_backward(r, b, 1); });
      trainer.accumulate([&](auto& r) { forward_backward(r, b, 1); });  // gradients left for the module
      trained = test::parameter_values(model);
    }
    CHECK(test::parameter_values(model) == trained);
    for (auto& p : model.parameters()) {
      bool nonzero = false;
      for (float g : p.grad.as<float>()) nonzero |= g != 0.0f;
      CHECK_MESSAGE(nonzero, p.name);
    }
    // A second trainer over the same module starts from those values (its first broadcast is a no-op).
    ddp::trainer<test::mlp, ddp::update::sharded> again(model, comm, dev, sgd);
    CHECK(test::parameter_values(model) == trained);
    return 0;
  });
}

TEST_CASE("broadcast policies leave every rank with rank 0's buffers at the start of a step") {
  auto results = ddp::inproc::launch(3, [](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(seed);
    ddp::host::device dev;
    ddp::trainer<test::mlp, ddp::buffer_sync::broadcast_once_per_step> trainer(model, comm, dev, sgd);
    std::vector<float> seen;
    for (int s = 0; s < 2; ++s) {
      auto b = test::make_batch(per_rank_batch, 77 + static_cast<std::uint64_t>(comm.rank()) * 10 + s);
      trainer.step([&](auto& rep) {
        auto out = rep.forward(b.x);
        auto ce = ddp::nn::softmax_cross_entropy(out, b.y);
        rep.backward(ce.grad);
      });
    }
    // In the last step every rank starts from rank 0's broadcast buffers and updates them with
    // the same batch, so they must end equal.
    trainer.step([&](auto& rep) {
      auto b = test::make_batch(per_rank_batch, 5);
      auto out = rep.forward(b.x);
      auto ce = ddp::nn::softmax_cross_entropy(out, b.y);
      rep.backward(ce.grad);
    });
    auto rm = model.layer<1>().running_mean();
    return std::vector<float>(rm.begin(), rm.end());
  });
  // Each rank updated rank 0's broadcast buffer with the same batch (seed 5) in the last step.
  CHECK(results[1] == results[0]);
  CHECK(results[2] == results[0]);
}

namespace {
// A step loop written once against the core, which every trainer over test::mlp shares.
template <class Core>
std::vector<std::vector<float>> two_steps(Core& trainer, test::mlp& model, int rank) {
  for (int s = 0; s < 2; ++s) {
    const auto b = test::make_batch(per_rank_batch, 50 + static_cast<std::uint64_t>(s * 4 + rank));
    trainer.step([&](auto& r) { forward_backward(r, b, 1); });
  }
  return test::parameter_values(model);
}
}  // namespace

TEST_CASE("trainers over one module, communicator and device share one trainer_core, whatever their policies") {
  using contiguous = ddp::trainer<test::mlp, ddp::sampler::contiguous, ddp::optim::adamw>;
  using shuffled = ddp::trainer<test::mlp, ddp::optim::adamw>;
  using reordered = ddp::trainer<test::mlp, ddp::optim::adamw, ddp::buffer_sync::broadcast_once_per_step,
                                 ddp::sampler::distributed<false, ddp::sampler::tail::drop>>;
  using other = ddp::trainer<test::mlp, ddp::buffer_sync::average_once_per_step, ddp::unused_params::static_graph,
                             ddp::update::sharded, ddp::bucket_cap<1024>>;
  static_assert(std::is_same_v<contiguous::core_type, shuffled::core_type>);
  static_assert(std::is_same_v<contiguous::core_type, reordered::core_type>);
  static_assert(std::is_same_v<contiguous::core_type, other::core_type>);
  static_assert(std::is_base_of_v<shuffled::core_type, shuffled>);
  CHECK(contiguous::describe_policies() ==
        "buffer_sync=broadcast_once_per_step, unused_params=forbid, bucket_cap=25 MiB, optimizer=adamw, "
        "update=replicated, communicator=inproc, sampler=contiguous");
  auto results = ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) {
    ddp::host::device dev;
    auto a = test::make_mlp(seed), b = test::make_mlp(seed);
    contiguous ta(a, comm, dev, adamw);
    shuffled tb(b, comm, dev, adamw);
    return std::pair{two_steps<shuffled::core_type>(ta, a, comm.rank()), two_steps<shuffled::core_type>(tb, b, comm.rank())};
  });
  for (const auto& [a, b] : results) CHECK(a == b);  // the same core, the same steps: the same bits
}

TEST_CASE("ranks with different numbers of micro-batches in a step equal one process over all of them") {
  // Rank r runs r + 1 micro-batches of 4 samples (worlds 2 and 3); the reference averages the
  // gradients of all the micro-batches, as one process accumulating them would.
  for (int world : {2, 3}) {
    CAPTURE(world);
    constexpr std::size_t rows = 4;
    auto batch_of = [](int rank, int k, int step) {
      return test::make_batch(rows, 7000 + static_cast<std::uint64_t>(100 * step + 10 * rank + k));
    };
    auto model = test::make_mlp(seed);
    test::reference_sgd opt(model, sgd);
    for (int s = 0; s < 2; ++s) {
      int count = 0;
      for (int r = 0; r < world; ++r)
        for (int k = 0; k <= r; ++k, ++count) {
          const auto b = batch_of(r, k, s);
          model.backward(ddp::nn::softmax_cross_entropy(model.forward(b.x), b.y).grad, ddp::ready_sink{});
        }
      for (auto& p : model.parameters())
        for (auto& g : p.grad.as<float>()) g /= static_cast<float>(count);
      opt.step();
    }
    const auto reference = test::parameter_values(model);
    auto ranks = ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
      auto m = test::make_mlp(seed);
      ddp::host::device dev;
      ddp::trainer<test::mlp, ddp::bucket_cap<256>, ddp::buffer_sync::none> trainer(m, comm, dev, sgd);
      for (int s = 0; s < 2; ++s) {
        for (int k = 0; k <= comm.rank(); ++k) {
          const auto b = batch_of(comm.rank(), k, s);
          auto body = [&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); };
          if (k < comm.rank()) trainer.accumulate(body);
          else trainer.step(body);
        }
      }
      return test::parameter_values(m);
    });
    for (const auto& rank : ranks) CHECK(test::max_relative_error(rank, reference) <= 1e-5);
  }
}

TEST_CASE_TEMPLATE("Join: ranks with unequal numbers of batches finish together, equal to one process over the union",
                   Unused, ddp::unused_params::forbid, ddp::unused_params::detect_each_step,
                   ddp::unused_params::static_graph) {
  auto check = [&]<class Sync, class Update = ddp::update::replicated>() {
    for (int world : {2, 3, 4}) {
      CAPTURE(world);
      INFO("buffer_sync::", Sync::name, " unused_params::", Unused::name, " update::", Update::name);
      const auto reference = join_reference(world);
      const auto ranks = ddp::inproc::launch(
          world, [](ddp::inproc::communicator& comm) { return run_join_rank<Sync, Unused, ddp::inproc::communicator, Update>(comm); });
      for (int r = 0; r < world; ++r) {
        CAPTURE(r);
        const auto& [params, shadowed] = ranks[static_cast<std::size_t>(r)];
        CHECK(test::max_relative_error(params, reference) <= 1e-5);
        CHECK(shadowed == static_cast<std::size_t>(join_steps_of(world - 1) - join_steps_of(r)));
      }
    }
  };
  check.template operator()<ddp::buffer_sync::none>();
  check.template operator()<ddp::buffer_sync::broadcast_each_forward>();
  check.template operator()<ddp::buffer_sync::broadcast_once_per_step>();
  check.template operator()<ddp::buffer_sync::average_once_per_step>();
  check.template operator()<ddp::buffer_sync::broadcast_once_per_step, ddp::update::sharded>();
}

TEST_CASE("optim::external over a module that binds no gradient storage: the averaged gradients reach the module") {
  // The same two ranks over test::mlp (gradients bound into the buckets) and test::unbound_mlp
  // (the trainer copies them in, and now back out).
  auto gradients = [](auto make) {
    return ddp::inproc::launch(2, [&](ddp::inproc::communicator& comm) {
      auto model = make();
      ddp::host::device dev;
      ddp::trainer<decltype(model), ddp::optim::external, ddp::bucket_cap<256>> trainer(model, comm, dev);
      const auto b = test::make_batch(per_rank_batch, 11 + static_cast<std::uint64_t>(comm.rank()));
      trainer.step([&](auto& rep) { forward_backward(rep, b, 1); });
      std::vector<std::vector<float>> g;
      for (auto& p : model.parameters()) {
        const auto v = p.grad.template as<float>();
        g.emplace_back(v.begin(), v.end());
      }
      return g;
    });
  };
  const auto bound = gradients([] { return test::make_mlp(seed); });
  const auto unbound = gradients([] { return test::unbound_mlp(test::make_mlp(seed)); });
  CHECK(bound[0] == bound[1]);  // averaged: the same on both ranks
  CHECK(unbound[0] == bound[0]);
  CHECK(unbound[1] == bound[1]);
}

}  // namespace trainer_equivalence_test
