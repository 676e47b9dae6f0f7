// Communication hooks: fp16 and bf16 compression stay within their derived bound of one process
// on the global batch (trainer/hook_bound.hpp derives it), and do compress; fp16 divides before it
// sums; a hook written outside the library runs in the slot.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/inproc/launch.hpp"
#include "support/constant_gradient.hpp"
#include "support/user_policies.hpp"
#include "trainer/equivalence.hpp"
#include "trainer/hook_bound.hpp"
#include "trainer/test_model.hpp"

namespace policy_comm_hook_test {

namespace {

using namespace equivalence;

template <class Hook, class Update>
void check_within_bound(double u, double absolute_per_rank) {
  double worst = 0, largest = 0;
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    INFO("hook ", Hook::name, ", update ", Update::name);
    const auto ref = hook_bound::reference_with_bound(world, hook_bound::rho(world, u, 1), (world + 1) * absolute_per_rank);
    for (auto how : {shape::one_forward, shape::two_micro_batches}) {
      CAPTURE(static_cast<int>(how));
      const auto ranks = ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
        return run_rank<ddp::buffer_sync::none, ddp::unused_params::forbid, ddp::inproc::communicator, Update,
                        ddp::optim::sgd, test::mlp, Hook>(comm, how);
      });
      for (const auto& rank : ranks) CHECK(rank.params == ranks[0].params);  // every rank the same bits
      const auto [here, share] = hook_bound::check(ranks[0].params, ref);
      largest = std::max(largest, here);
      worst = std::max(worst, share);
    }
  }
  MESSAGE(Hook::name, ", ", Update::name, ", worlds 2-4: largest relative error ", largest, ", at most ", worst,
          " of its bound");
}

// A hook that derives from none but does its own reduce inherits none's `plain`, which must not
// count; one that declares it again is plain.
struct own_reduce : ddp::comm_hook::none {
  void reduce(ddp::comm_hook::bucket_io& b) { b.reduce_gradients(); }
};
struct declared_plain : ddp::comm_hook::none {
  static constexpr bool plain = true;
};
static_assert(ddp::comm_hook::is_plain<ddp::comm_hook::none>());
static_assert(!ddp::comm_hook::is_plain<own_reduce>());
static_assert(ddp::comm_hook::is_plain<declared_plain>());

}  // namespace

TEST_CASE_TEMPLATE("bf16 and fp16 hooks stay within the derived bound of one process on the global batch", Update,
                   ddp::update::replicated, ddp::update::sharded) {
  SUBCASE("bf16") { check_within_bound<ddp::comm_hook::bf16, Update>(0x1p-8, 0.0); }
  SUBCASE("fp16") { check_within_bound<ddp::comm_hook::fp16, Update>(0x1p-11, 0x1p-25); }
}

TEST_CASE("fp16 divides before the sum: ranks whose average fits in f16 do not overflow it") {
  // 40000 on every rank sums to 80000 or more, past f16's 65504; its average, 40000, fits.
  for (int world : {2, 3}) {
    CAPTURE(world);
    const auto values = ddp::inproc::launch(world, [](ddp::inproc::communicator& comm) {
      test::constant_gradient m;
      ddp::host::device dev;
      ddp::trainer<test::constant_gradient, ddp::comm_hook::fp16> trainer(m, comm, dev, ddp::optim::sgd{.lr = 1.0f});
      trainer.step([](auto& r) { r.backward(r.forward(40000.0f)); });
      return m.value;
    });
    for (const auto& v : values)
      for (float x : v) CHECK(x == -40000.0f);  // 40000 / N in f16, summed, is 40000 again (exactly: 40000 = 625 * 2^6)
  }
}

TEST_CASE("a hook written outside the library fills the slot: average_in_f64") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    const auto ref = reference(world);
    auto run = [&]<class Update>() {
      return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
        auto model = test::make_mlp(seed + static_cast<std::uint64_t>(comm.rank()));
        ddp::host::device dev;
        ddp::trainer<test::mlp, Update, user::average_in_f64, ddp::bucket_cap<256>> trainer(model, comm, dev, sgd);
        for (int s = 0; s < steps; ++s) {
          const auto global = test::make_batch(per_rank_batch * static_cast<std::size_t>(world), 1000 + s);
          const std::size_t r = static_cast<std::size_t>(comm.rank());
          const auto mine = global.rows(r * per_rank_batch, (r + 1) * per_rank_batch);
          trainer.step([&](auto& rep) { rep.backward(ddp::nn::softmax_cross_entropy(rep.forward(mine.x), mine.y).grad); });
        }
        CHECK(trainer.template policy<ddp::comm_hook::slot>().finished == static_cast<int>(trainer.bucket_count()) * steps);
        return test::parameter_values(model);
      });
    };
    for (const auto& params : run.template operator()<ddp::update::replicated>())
      CHECK(test::max_relative_error(params, ref.params) <= 1e-5);
    for (const auto& params : run.template operator()<ddp::update::sharded>())
      CHECK(test::max_relative_error(params, ref.params) <= 1e-5);
  }
}

}  // namespace policy_comm_hook_test
