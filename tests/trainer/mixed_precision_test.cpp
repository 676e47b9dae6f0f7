// Mixed-precision parameters: a module that holds bf16 or f16 parameters is
// trained through the trainer's f32 master copy. N ranks stay within bf16's rounding of one
// process on the global batch; updates too small for bf16 are kept by the master; a checkpoint
// resumes bitwise (it holds the master); sharded equals replicated; what cannot work is an error
// naming the parameter (an f64 parameter: pitfalls_test.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/inproc/launch.hpp"
#include "trainer/equivalence.hpp"
#include "trainer/test_model.hpp"

namespace trainer_mixed_precision_test {

namespace {

using namespace equivalence;
namespace fs = std::filesystem;

test::mlp cast_mlp(std::uint64_t seed, ddp::dtype t) {
  auto m = test::make_mlp(seed);
  m.cast_parameters(t);
  return m;
}

// `steps` SGD steps of the global batch's rows [rank * rows, (rank + 1) * rows) on each rank, one
// forward or two micro-batches; every rank's held parameters.
template <class Update, class Hook = ddp::comm_hook::none>
std::vector<std::vector<std::vector<float>>> train(int world, ddp::dtype t, int steps, std::size_t rows,
                                                   bool micro_batches = false) {
  return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
    auto model = cast_mlp(seed, t);
    ddp::host::device dev;
    ddp::trainer<test::mlp, Update, Hook, ddp::bucket_cap<256>> trainer(model, comm, dev, sgd);
    for (int s = 0; s < steps; ++s) {
      const auto global = test::make_batch(rows * static_cast<std::size_t>(world), 1000 + s);
      const auto r = static_cast<std::size_t>(comm.rank());
      const auto mine = global.rows(r * rows, (r + 1) * rows);
      if (micro_batches) {
        trainer.accumulate([&](auto& rep) { forward_backward(rep, mine.rows(0, rows / 2), 1); });
        trainer.step([&](auto& rep) { forward_backward(rep, mine.rows(rows / 2, rows), 1); });
      } else {
        trainer.step([&](auto& rep) { forward_backward(rep, mine, 1); });
      }
    }
    return test::held_values(model);
  });
}


}  // namespace

TEST_CASE("bf16 and f16 parameters with an f32 master: N ranks stay within one 16-bit step of one process on the "
          "global batch, beyond that process's own distance to f32") {
  constexpr int k = 8;
  for (auto type : {ddp::dtype::bf16, ddp::dtype::f16})
    for (int world : {2, 3}) {
      CAPTURE(world);
      const std::string dtype(ddp::name_of(type));
      CAPTURE(dtype);
      // One process on the global batch with 16-bit parameters, and the same in f32.
      const auto reference = train<ddp::update::replicated>(1, type, k, per_rank_batch * world)[0];
      const auto f32 = train<ddp::update::replicated>(1, ddp::dtype::f32, k, per_rank_batch * world)[0];
      for (bool micro : {false, true}) {
        CAPTURE(micro);
        const auto ranks = train<ddp::update::replicated>(world, type, k, per_rank_batch, micro);
        const auto sharded = train<ddp::update::sharded>(world, type, k, per_rank_batch, micro);
        for (const auto& r : ranks) CHECK(r == ranks[0]);  // every replica the same bits
        CHECK(sharded[0] == ranks[0]);                     // sharded: the same arithmetic per element
        // The bound. Each rank rounds its own gradient to 16 bits where one process rounds the
        // global one (2u per element and step; u = 2^-8 for bf16, 2^-11 for f16): the masters
        // drift apart by errors of the kind, and the size, of the one process's own rounding of
        // its parameters, whose distance to f32 (`precision`) measures it. A master that moved by
        // that much may round to the neighbouring 16-bit value: one step of 2u at most per
        // element of the held values compared here. So: distributed <= precision + 2u, per tensor.
        const double u = type == ddp::dtype::bf16 ? 0x1p-8 : 0x1p-11;
        double worst_share = 0;
        for (std::size_t t = 0; t < reference.size(); ++t) {
          CAPTURE(t);
          const double distributed = test::max_relative_error({ranks[0][t]}, {reference[t]});
          const double precision = test::max_relative_error({f32[t]}, {reference[t]});
          CHECK(precision > 0);  // the 16-bit run is not the f32 one
          CHECK(distributed <= precision + 2 * u);
          worst_share = std::max(worst_share, distributed / (precision + 2 * u));
        }
        const std::string what = dtype + ", world " + std::to_string(world) + (micro ? ", two micro-batches" : "") +
                                 ": N ranks against one process, at most " + std::to_string(worst_share) +
                                 " of the bound";
        MESSAGE(what);
      }
    }
}

TEST_CASE("updates smaller than bf16's resolution are kept by the master copy, not lost") {
  // lr small enough that one step moves a weight by about a hundredth of a bf16 step (2^-8 of it):
  // the module's bf16 values keep their bits over a step but for the few next to a rounding
  // boundary, and move once the master has gathered enough. Updating the bf16 values themselves
  // would round every such step away.
  ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) {
    auto model = cast_mlp(seed, ddp::dtype::bf16);
    ddp::host::device dev;
    ddp::trainer<test::mlp, ddp::bucket_cap<256>> trainer(model, comm, dev, ddp::optim::sgd{.lr = 1e-4f});
    const auto start = test::held_values(model);
    const auto b = test::make_batch(per_rank_batch, 7 + static_cast<std::uint64_t>(comm.rank()));
    auto step = [&] { trainer.step([&](auto& rep) { forward_backward(rep, b, 1); }); };
    step();
    std::size_t moved_after_one = 0, moved = 0, total = 0;
    const auto after_one = test::held_values(model);
    for (std::size_t t = 0; t < start.size(); ++t)
      for (std::size_t i = 0; i < start[t].size(); ++i) moved_after_one += after_one[t][i] != start[t][i];
    for (int s = 0; s < 1000; ++s) step();
    const auto end = test::held_values(model);
    for (std::size_t t = 0; t < start.size(); ++t)
      for (std::size_t i = 0; i < start[t].size(); ++i) moved += end[t][i] != start[t][i], ++total;
    // After one step, a few: the zero-initialised bias of the affine layer (bf16 is as fine as f32
    // near zero) and any weight next to a rounding boundary.
    CHECK(moved_after_one * 20 < total);
    CHECK(moved * 2 > total);  // most, after 1001 steps
    const std::string what = "bf16 values moved: " + std::to_string(moved_after_one) + " of " + std::to_string(total) +
                             " after one step, " + std::to_string(moved) + " after 1001";
    MESSAGE(what);
  });
}

TEST_CASE("a checkpoint of 16-bit parameters holds their masters: resuming is bitwise the run that never stopped") {
  const fs::path dir = fs::temp_directory_path() / "ddp_mixed_precision_checkpoint";
  fs::remove_all(dir);
  for (auto type : {ddp::dtype::bf16, ddp::dtype::f16}) {
    const std::string dtype(ddp::name_of(type));
    CAPTURE(dtype);
    auto run = [&](int first, int last, bool resume, bool save) {
      return ddp::inproc::launch(2, [&](ddp::inproc::communicator& comm) {
        auto model = cast_mlp(seed + 1 + static_cast<std::uint64_t>(comm.rank()), type);  // rank 0's wins, or the file's
        ddp::host::device dev;
        ddp::trainer<test::mlp, ddp::optim::adamw, ddp::update::sharded, ddp::bucket_cap<256>> trainer(model, comm, dev,
                                                                                                       adamw);
        if (resume) trainer.load(dir);
        for (int s = first; s < last; ++s) {
          const auto global = test::make_batch(2 * per_rank_batch, 300 + static_cast<std::uint64_t>(s));
          const auto r = static_cast<std::size_t>(comm.rank());
          trainer.step([&](auto& rep) { forward_backward(rep, global.rows(r * per_rank_batch, (r + 1) * per_rank_batch), 1); });
        }
        if (save) trainer.save(dir);
        return test::held_values(model);
      });
    };
    const auto straight = run(0, 12, false, false);
    run(0, 5, false, true);
    const auto resumed = run(5, 12, true, false);
    CHECK(resumed == straight);
    fs::remove_all(dir);
  }
}

TEST_CASE("what 16-bit parameters cannot do is an error naming the parameter") {
  SUBCASE("optim::external would step the 16-bit values, past the master") {
    const auto errors = ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) -> std::string {
      auto model = cast_mlp(seed, ddp::dtype::bf16);
      ddp::host::device dev;
      try {
        ddp::trainer<test::mlp, ddp::optim::external> trainer(model, comm, dev);
      } catch (const std::exception& e) {
        return e.what();
      }
      return "";
    });
    for (const auto& e : errors) {
      CHECK(e.find("parameter '0.weight' is bf16") != std::string::npos);
      CHECK(e.find("optim::external") != std::string::npos);
    }
  }
  SUBCASE("a cast once a trainer holds the storage") {
    ddp::inproc::launch(1, [](ddp::inproc::communicator& comm) {
      auto model = test::make_mlp(seed);
      ddp::host::device dev;
      ddp::trainer<test::mlp> trainer(model, comm, dev);
      CHECK_THROWS_WITH_AS(model.cast_parameters(ddp::dtype::bf16),
                           doctest::Contains("cast the module before building the trainer"), std::logic_error);
    });
  }
}

}  // namespace trainer_mixed_precision_test
