// The trainer's equivalence test on MPI processes: each process is one rank, and checks its
// parameters against one process on the global batch.
#include <doctest/doctest.h>

#include "mpi/world.hpp"
#include "ddp/host/linalg.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/policy/powersgd.hpp"
#include "support/constant_gradient.hpp"
#include "support/fixed_gradient.hpp"
#include "support/on_ranks.hpp"
#include "trainer/equivalence.hpp"
#include "trainer/hook_bound.hpp"
#include "trainer/invariance.hpp"

namespace mpi_trainer_test {

using namespace equivalence;

TEST_CASE_TEMPLATE("mpi: N processes equal one process on the global batch", Sync, ddp::buffer_sync::none,
                   ddp::buffer_sync::broadcast_each_forward, ddp::buffer_sync::broadcast_once_per_step,
                   ddp::buffer_sync::average_once_per_step) {
  auto& comm = mpi_test::comm();
  const auto ref = reference(comm.size());
  for (auto how : {shape::one_forward, shape::two_forwards, shape::two_micro_batches}) {
    CAPTURE(static_cast<int>(how));
    CHECK(test::max_relative_error(run_rank<Sync, ddp::unused_params::forbid>(comm, how).params, ref.params) <= 1e-5);
    CHECK(test::max_relative_error(run_rank<Sync, ddp::unused_params::detect_each_step>(comm, how).params, ref.params) <= 1e-5);
    CHECK(test::max_relative_error(run_rank<Sync, ddp::unused_params::static_graph>(comm, how).params, ref.params) <= 1e-5);
  }
}

TEST_CASE("mpi: update::sharded, sharded_gradients and fully_sharded, and the optimizer overlapped with the "
          "reductions, leave every process with bitwise the parameters of update::replicated") {
  using ddp::mpi::communicator, ddp::update::replicated, ddp::update::sharded, ddp::update::sharded_gradients,
      ddp::update::fully_sharded;
  using sync = ddp::buffer_sync::broadcast_once_per_step;
  using detect = ddp::unused_params::detect_each_step;
  auto& comm = mpi_test::comm();
  for (auto how : {shape::one_forward, shape::two_micro_batches}) {
    CAPTURE(static_cast<int>(how));
    CHECK(run_rank<sync, detect, communicator, sharded>(comm, how).params ==
          run_rank<sync, detect, communicator, replicated>(comm, how).params);
    CHECK(run_rank<sync, detect, communicator, sharded, ddp::optim::adamw>(comm, how).params ==
          run_rank<sync, detect, communicator, replicated, ddp::optim::adamw>(comm, how).params);
    CHECK(run_rank<sync, detect, communicator, sharded_gradients, ddp::optim::adamw>(comm, how).params ==
          run_rank<sync, detect, communicator, replicated, ddp::optim::adamw>(comm, how).params);
    // The optimizer overlapped with the reductions: MPI's requests complete in any order, the
    // update takes them in bucket order.
    CHECK(run_rank<sync, detect, communicator, replicated>(comm, how, /*overlap=*/true).params ==
          run_rank<sync, detect, communicator, replicated>(comm, how).params);
    CHECK(run_rank<sync, detect, communicator, sharded_gradients, ddp::optim::adamw>(comm, how, true).params ==
          run_rank<sync, detect, communicator, replicated, ddp::optim::adamw>(comm, how).params);
    // The parameters gathered layer by layer: MPI's all_gather requests beside the reductions'.
    CHECK(run_rank<sync, detect, communicator, fully_sharded, ddp::optim::adamw>(comm, how).params ==
          run_rank<sync, detect, communicator, replicated, ddp::optim::adamw>(comm, how).params);
    CHECK(run_rank<sync, detect, communicator, fully_sharded, ddp::optim::adamw>(comm, how, true).params ==
          run_rank<sync, detect, communicator, replicated, ddp::optim::adamw>(comm, how).params);
  }
}

TEST_CASE("mpi: bf16 and fp16 hooks stay within the derived bound, with every step of the sum rounded to 16 bits") {
  using ddp::mpi::communicator;
  auto& comm = mpi_test::comm();
  const int n = comm.size();
  auto run = [&]<class Hook, class Update>(double u, double absolute) {
    INFO("hook ", Hook::name, ", update ", Update::name);
    const auto ref = hook_bound::reference_with_bound(n, hook_bound::rho(n, u, n - 1), 2 * n * absolute);
    const auto params = run_rank<ddp::buffer_sync::none, ddp::unused_params::forbid, communicator, Update,
                                 ddp::optim::sgd, test::mlp, Hook>(comm, shape::one_forward)
                            .params;
    hook_bound::check(params, ref);
  };
  run.template operator()<ddp::comm_hook::bf16, ddp::update::replicated>(0x1p-8, 0.0);
  run.template operator()<ddp::comm_hook::bf16, ddp::update::sharded>(0x1p-8, 0.0);
  run.template operator()<ddp::comm_hook::fp16, ddp::update::replicated>(0x1p-11, 0x1p-25);
}

TEST_CASE("mpi: fp16 divides before the sum, which MPI rounds to f16 at every step") {
  auto& comm = mpi_test::comm();
  test::constant_gradient m;
  ddp::host::device dev;
  ddp::trainer<test::constant_gradient, ddp::comm_hook::fp16, ddp::use_communicator<ddp::mpi::communicator>> trainer(
      m, comm, dev, ddp::optim::sgd{.lr = 1.0f});
  trainer.step([](auto& r) { r.backward(r.forward(40000.0f)); });  // the sum, 40000 N, is past f16's 65504
  for (float x : m.value) CHECK(x == -40000.0f);
}

TEST_CASE("mpi: powersgd applies the average gradient at full rank, and recovers what rank 1 drops by error feedback") {
  auto& comm = mpi_test::comm();
  auto applied = [&]<std::size_t Rank>(int steps, float min_compression_rate) {
    test::fixed_gradient m(comm.rank());
    ddp::host::device dev;
    ddp::trainer<test::fixed_gradient, ddp::comm_hook::powersgd<Rank>, ddp::use_communicator<ddp::mpi::communicator>>
        trainer(m, comm, dev, ddp::optim::sgd{.lr = 1.0f});
    auto& hook = trainer.template policy<ddp::comm_hook::slot>();
    hook.start_after = 0;
    hook.min_compression_rate = min_compression_rate;
    for (int s = 0; s < steps; ++s) trainer.step([](auto& r) { r.backward(r.forward(0)); });
    std::vector<float> mean(m.w.size());
    for (std::size_t i = 0; i < mean.size(); ++i) mean[i] = -m.w[i] / static_cast<float>(steps);
    return test::fixed_gradient::error_against_average(mean, comm.size());
  };
  CHECK(applied.template operator()<16>(5, 0.0f) < 1e-5);  // the P and Q collectives between processes
  CHECK(applied.template operator()<1>(240, 2.0f) < 0.06);  // error feedback (in-process: 0.04)
}

TEST_CASE("mpi: bf16 parameters with an f32 master: processes train as in-process ranks do, within one bf16 step") {
  // Each process starts from its own weights (rank 0's are broadcast, in bf16); the f32 sums of
  // MPI and of the in-process backend may differ in order, so a master may round to the
  // neighbouring bf16 value: one step, 2^-7 relative, at most.
  auto& comm = mpi_test::comm();
  auto run = [&](auto& c) {
    auto model = test::make_mlp(seed + static_cast<std::uint64_t>(c.rank()));
    model.cast_parameters(ddp::dtype::bf16);
    ddp::host::device dev;
    ddp::trainer<test::mlp, ddp::bucket_cap<256>, ddp::use_communicator<std::remove_cvref_t<decltype(c)>>> trainer(
        model, c, dev, sgd);
    for (int s = 0; s < steps; ++s) {
      const auto global = test::make_batch(per_rank_batch * static_cast<std::size_t>(c.size()), 1000 + s);
      const auto r = static_cast<std::size_t>(c.rank());
      trainer.step([&](auto& rep) { forward_backward(rep, global.rows(r * per_rank_batch, (r + 1) * per_rank_batch), 1); });
    }
    return test::held_values(model);
  };
  const auto mine = run(comm);
  const auto inproc = ddp::inproc::launch(comm.size(), [&](ddp::inproc::communicator& c) { return run(c); })[0];
  for (std::size_t t = 0; t < mine.size(); ++t) {
    CAPTURE(t);
    CHECK(test::max_relative_error({mine[t]}, {inproc[t]}) <= 0x1p-7);
  }
}

TEST_CASE("mpi: a parameter skipped on one rank is one error on every rank (P2)") {
  auto& comm = mpi_test::comm();
  test::branchy model(5);
  ddp::host::device dev;
  ddp::trainer<test::branchy, ddp::use_communicator<ddp::mpi::communicator>> trainer(model, comm, dev, sgd);
  model.use_aux = comm.rank() != 1;
  auto b = test::make_batch(6, 20);
  CHECK_THROWS_WITH_AS(
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); }),
      doctest::Contains("'aux.weight' (no gradient on rank(s) 1)"), ddp::collective_error);
}

// Every rank's policies agree (trainer/policy_agreement.hpp): a one_of that selected static_graph on
// rank 1 and forbid elsewhere (the same collectives: unseen without the agreement), and a trainer of
// another policy list on rank 1, are the same error on every process, and the communicator goes on.
TEST_CASE("mpi: policies that differ on one rank are one error on every rank, naming the slot and both sides") {
  auto& comm = mpi_test::comm();
  using communicator = ddp::use_communicator<ddp::mpi::communicator>;
  const auto b = test::make_batch(6, 20 + static_cast<std::uint64_t>(comm.rank()));
  auto step = [&](auto& trainer) {
    trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
  };
  std::string others;  // "ranks 0, 2, 3" of a world of 4
  for (int r = 0; r < comm.size(); ++r)
    if (r != 1) others += (others.empty() ? "" : ", ") + std::to_string(r);
  others = (comm.size() > 2 ? "ranks " : "rank ") + others + (comm.size() > 2 ? " run" : " runs");
  const std::string expected = "ranks run different policies in slot unused_params: " + others +
                               " 'forbid'; rank 1 runs 'static_graph'";
  {
    using unused_choice = ddp::unused_params::one_of<ddp::unused_params::forbid, ddp::unused_params::static_graph>;
    test::branchy model(5);
    ddp::host::device dev;
    ddp::trainer<test::branchy, communicator, unused_choice> trainer(model, comm, dev, sgd);
    trainer.policy<ddp::unused_params::slot>().select(comm.rank() == 1 ? "static_graph" : "forbid");
    try {
      step(trainer);
      FAIL("the step ran with policies that differ");
    } catch (const ddp::collective_error& e) {
      CHECK(test::first_line(e.detail()) == expected);
      CHECK(e.operation() == "step");
    }
  }
  ddp::comm::barrier(comm);
  auto build = [&]<class Unused>() {
    test::branchy model(5);
    ddp::host::device dev;
    ddp::trainer<test::branchy, communicator, Unused> trainer(model, comm, dev, sgd);
    step(trainer);
  };
  try {
    if (comm.rank() == 1) build.template operator()<ddp::unused_params::static_graph>();
    else build.template operator()<ddp::unused_params::forbid>();
    FAIL("trainers of different policy lists were built");
  } catch (const ddp::collective_error& e) {
    CHECK(test::first_line(e.detail()) == expected);
    CHECK(e.operation() == "construct");
  }
  ddp::comm::barrier(comm);  // nothing mismatched reached MPI
}

TEST_CASE("mpi: Join: processes with unequal numbers of batches finish together, equal to one process over the union") {
  using ddp::mpi::communicator;
  auto& comm = mpi_test::comm();
  const auto reference = join_reference(comm.size());
  const std::size_t expected = static_cast<std::size_t>(join_steps_of(comm.size() - 1) - join_steps_of(comm.rank()));
  {
    const auto [params, shadowed] = run_join_rank<ddp::buffer_sync::broadcast_once_per_step, ddp::unused_params::forbid,
                                                  communicator>(comm);
    CHECK(test::max_relative_error(params, reference) <= 1e-5);
    CHECK(shadowed == expected);
  }
  {
    const auto [params, shadowed] = run_join_rank<ddp::buffer_sync::average_once_per_step,
                                                  ddp::unused_params::detect_each_step, communicator,
                                                  ddp::update::sharded>(comm);
    CHECK(test::max_relative_error(params, reference) <= 1e-5);
    CHECK(shadowed == expected);
  }
}

TEST_CASE_TEMPLATE("mpi: reduction::invariant: N processes take the bits of one in-process rank on the global batch",
                   Update, ddp::update::replicated, ddp::update::sharded) {
  auto& comm = mpi_test::comm();
  using invariant = ddp::reduction::invariant<invariance::shards>;
  const ddp::optim::adamw opt{.lr = 0.01f, .weight_decay = 1e-2f};
  const auto one = ddp::inproc::launch(1, [&](ddp::inproc::communicator& c) {
    return invariance::train_rank<invariant, Update>(c, opt);
  })[0];
  CHECK(invariance::bitwise_equal(invariance::train_rank<invariant, Update>(comm, opt), one));
}

}  // namespace mpi_trainer_test
