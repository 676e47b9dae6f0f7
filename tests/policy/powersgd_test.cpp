// comm_hook::powersgd: its orthonormalisation; the plain reduction's bits before start_after;
// the average gradient at full rank; error feedback that recovers what a low rank drops;
// training loss within the stated margin of f32 (docs/policies.md); and a resume from a
// checkpoint that continues with the same bits, the hook's state included.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/host/linalg.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/policy/powersgd.hpp"
#include "support/fixed_gradient.hpp"
#include "support/relative_error.hpp"
#include "trainer/equivalence.hpp"
#include "trainer/test_model.hpp"

namespace policy_powersgd_test {

namespace {

using params_t = std::vector<std::vector<float>>;

// Trains test::mlp on rank `comm.rank()`'s part of make_batch(world * batch, 1000 + s) for each
// step s in [first, last); `configure` sets the hook's options.
template <class Trainer>
void train_steps(Trainer& trainer, ddp::inproc::communicator& comm, int first, int last, std::size_t batch) {
  for (int s = first; s < last; ++s) {
    const auto global = test::make_batch(batch * static_cast<std::size_t>(comm.size()), 1000 + static_cast<std::uint64_t>(s));
    const auto r = static_cast<std::size_t>(comm.rank());
    const auto mine = global.rows(r * batch, (r + 1) * batch);
    trainer.step([&](auto& rep) { rep.backward(ddp::nn::softmax_cross_entropy(rep.forward(mine.x), mine.y).grad); });
  }
}

template <class Hook, class Update = ddp::update::replicated, class Configure>
std::vector<params_t> run(int world, int steps, std::size_t batch, ddp::optim::sgd opt, Configure configure) {
  return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(equivalence::seed + static_cast<std::uint64_t>(comm.rank()));
    ddp::host::device dev;
    ddp::trainer<test::mlp, Update, Hook, ddp::bucket_cap<256>> trainer(model, comm, dev, opt);
    configure(trainer.template policy<ddp::comm_hook::slot>());
    train_steps(trainer, comm, 0, steps, batch);
    return test::parameter_values(model);
  });
}

// Mean cross-entropy of the model with these parameters over 1024 held-out samples.
double held_out_loss(const params_t& values) {
  auto model = test::make_mlp(equivalence::seed);
  std::size_t i = 0;
  for (auto&& p : model.parameters()) {
    ddp::parameter_ref ref = p;
    std::copy(values[i].begin(), values[i].end(), static_cast<float*>(ref.value.data));
    ++i;
  }
  const auto held = test::make_batch(1024, 99);
  return ddp::nn::softmax_cross_entropy(model.forward(held.x), held.y).loss;
}

// How far the average update over `steps` steps is from the average gradient (relative, in the
// Frobenius norm), with and without error feedback.
template <std::size_t Rank = 1, class Update = ddp::update::replicated>
double average_update_error(int world, int steps, bool error_feedback, float min_compression_rate = 2.0f) {
  const auto results = ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
    test::fixed_gradient m(comm.rank());
    ddp::host::device dev;
    ddp::trainer<test::fixed_gradient, Update, ddp::comm_hook::powersgd<Rank>> trainer(m, comm, dev, ddp::optim::sgd{.lr = 1.0f});
    auto& hook = trainer.template policy<ddp::comm_hook::slot>();
    hook.start_after = 0;
    hook.error_feedback = error_feedback;
    hook.min_compression_rate = min_compression_rate;
    for (int s = 0; s < steps; ++s) trainer.step([](auto& r) { r.backward(r.forward(0)); });
    std::vector<float> applied(m.w.size());
    for (std::size_t i = 0; i < applied.size(); ++i) applied[i] = -m.w[i] / static_cast<float>(steps);
    return std::pair{applied, m.b};
  });
  // The vector is never compressed: exactly the average (1 + ... + world) / world per step.
  for (float v : results[0].second) CHECK(v == doctest::Approx(-steps * (world + 1) / 2.0).epsilon(1e-6));
  return test::fixed_gradient::error_against_average(results[0].first, world);
}

}  // namespace

TEST_CASE("orthonormalize_columns leaves orthonormal columns, and a zero column zero") {
  ddp::host::device dev;
  constexpr std::size_t rows = 9, cols = 4;
  auto a = ddp::comm_hook::detail::normals(rows * cols, 5, 0, 0);
  for (std::size_t i = 0; i < rows; ++i) a[i * cols + 2] = 0.0f;  // column 2: zero
  ddp::host::orthonormalize_columns(dev, a.data(), rows, cols, 1e-8f);
  for (std::size_t j = 0; j < cols; ++j)
    for (std::size_t k = 0; k < cols; ++k) {
      double dot = 0;
      for (std::size_t i = 0; i < rows; ++i) dot += static_cast<double>(a[i * cols + j]) * a[i * cols + k];
      CAPTURE(j);
      CAPTURE(k);
      const double expected = j == k && j != 2 ? 1.0 : 0.0;
      CHECK(std::abs(dot - expected) < 1e-6);
    }
}

TEST_CASE_TEMPLATE("powersgd reduces plainly for its first start_after steps: the bits of comm_hook::none", Update,
                   ddp::update::replicated, ddp::update::sharded) {
  for (int world : {2, 3}) {
    CAPTURE(world);
    const auto plain = run<ddp::comm_hook::none, Update>(world, 4, 8, equivalence::sgd, [](auto&) {});
    const auto before = run<ddp::comm_hook::powersgd<1>, Update>(world, 4, 8, equivalence::sgd,
                                                                 [](auto& h) { h.start_after = 4; });
    const auto after = run<ddp::comm_hook::powersgd<1>, Update>(world, 4, 8, equivalence::sgd,
                                                                [](auto& h) { h.start_after = 3; });
    for (int r = 0; r < world; ++r) {
      CHECK(before[static_cast<std::size_t>(r)] == plain[0]);
      CHECK(after[static_cast<std::size_t>(r)] == after[0]);  // every rank the same bits
    }
    CHECK(after[0] != plain[0]);  // the fourth step was compressed
  }
}

TEST_CASE_TEMPLATE("powersgd at full rank applies the average gradient", Update, ddp::update::replicated,
                   ddp::update::sharded) {
  // Rank 16 covers the 24 x 16 matrix, and a compression rate of 0 compresses it all the same:
  // P's columns span the average, so P P^T M is M up to rounding.
  for (int world : {2, 3}) {
    CAPTURE(world);
    const double error = average_update_error<16, Update>(world, 5, true, 0.0f);
    MESSAGE("full-rank powersgd, world ", world, ", ", Update::name, ": relative error of the applied update ", error);
    CHECK(error < 1e-5);
  }
}

TEST_CASE("error feedback: the average update converges to the average gradient that rank 1 cannot carry") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    // The error e_T that feedback carries stays bounded, so the average update's error falls as 1/T
    // (measured: 0.32 at 30 steps, 0.17 at 60, 0.08 at 120, 0.04 at 240); without feedback the
    // update stays the average's best rank-1 part (error 0.9).
    const double with = average_update_error(world, 60, true), longer = average_update_error(world, 240, true);
    const double without = average_update_error(world, 60, false);
    MESSAGE("world ", world, ", a fixed full-rank gradient at rank 1: error of the average update ", with, " after 60 steps, ",
            longer, " after 240 with error feedback; ", without, " after 60 without");
    CHECK(with < 0.25);
    CHECK(longer < 0.3 * with);
    CHECK(without > 0.8);
  }
}

TEST_CASE("powersgd trains: held-out loss within the stated margin of f32 (docs/policies.md)") {
  // 150 steps, 2 ranks of 16 samples, compression from step 20 at rank 2 (test::mlp's matrices
  // are 16 x 6, 12 x 16 and 3 x 12: rank 2 compresses the first two, 4 none of them).
  const ddp::optim::sgd opt{.lr = 0.05f, .momentum = 0.9f};
  const auto plain = run<ddp::comm_hook::none>(2, 150, 16, opt, [](auto&) {});
  const auto compressed = run<ddp::comm_hook::powersgd<2>>(2, 150, 16, opt, [](auto& h) { h.start_after = 20; });
  const auto no_feedback = run<ddp::comm_hook::powersgd<2>>(2, 150, 16, opt, [](auto& h) {
    h.start_after = 20;
    h.error_feedback = false;
  });
  auto initial = test::make_mlp(equivalence::seed);
  const double start = held_out_loss(test::parameter_values(initial));
  const double f32 = held_out_loss(plain[0]), low_rank = held_out_loss(compressed[0]);
  const double without = held_out_loss(no_feedback[0]);
  MESSAGE("held-out loss: initial ", start, ", f32 ", f32, ", powersgd<2> ", low_rank, ", without error feedback ",
          without);
  CHECK(f32 < 0.5 * start);  // the run learns
  CHECK(low_rank <= f32 + 0.05 * start);
  CHECK(without > low_rank);  // error feedback earns its memory
}

TEST_CASE_TEMPLATE("a powersgd run resumed from a checkpoint continues with the same bits", Update,
                   ddp::update::replicated, ddp::update::sharded) {
  const auto dir = std::filesystem::temp_directory_path() / ("ddp_powersgd_resume_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto configure = [](auto& h) { h.start_after = 1; };
  const auto straight = run<ddp::comm_hook::powersgd<2>, Update>(2, 6, 8, equivalence::sgd, configure);
  const auto resumed = ddp::inproc::launch(2, [&](ddp::inproc::communicator& comm) {
    ddp::host::device dev;
    using trainer_t = ddp::trainer<test::mlp, Update, ddp::comm_hook::powersgd<2>, ddp::bucket_cap<256>>;
    {
      auto model = test::make_mlp(equivalence::seed + static_cast<std::uint64_t>(comm.rank()));
      trainer_t first(model, comm, dev, equivalence::sgd);
      configure(first.template policy<ddp::comm_hook::slot>());
      train_steps(first, comm, 0, 3, 8);
      first.save(dir);
    }
    auto model = test::make_mlp(1234 + static_cast<std::uint64_t>(comm.rank()));  // other values: the checkpoint's win
    trainer_t second(model, comm, dev, equivalence::sgd);
    configure(second.template policy<ddp::comm_hook::slot>());
    second.load(dir);
    train_steps(second, comm, 3, 6, 8);
    return test::parameter_values(model);
  });
  CHECK(resumed[0] == straight[0]);
  CHECK(resumed[1] == straight[1]);
  std::filesystem::remove_all(dir);
}

}  // namespace policy_powersgd_test
