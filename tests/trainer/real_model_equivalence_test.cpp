// The example's real model (784-512-512-10 with batch_norm) on real Fashion-MNIST batches: with
// synchronised batch statistics, N ranks equal one process on the global batch.
#include <doctest/doctest.h>

#include "ddp/data/fashion_mnist.hpp"
#include "ddp/ddp.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/nn/cross_entropy.hpp"
#include "ddp/nn/sync.hpp"
#include "fashion_mnist/model.hpp"
#include "trainer/test_model.hpp"

namespace trainer_real_model_equivalence_test {

namespace {

using ddp::data::fashion_mnist;
constexpr std::size_t hidden = 128;  // the example's shape with narrower hidden layers keeps the test quick
constexpr std::size_t per_rank = 16;
constexpr int steps = 3;
const ddp::optim::sgd sgd{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f};

fashion_mnist::batch global_batch(const fashion_mnist& data, int step, int world) {
  std::vector<fashion_mnist::example> ex;
  const std::size_t n = per_rank * static_cast<std::size_t>(world);
  for (std::size_t i = 0; i < n; ++i) ex.push_back(data.get(static_cast<std::size_t>(step) * 997 + i * 7));
  return fashion_mnist::collate(ex);
}

}  // namespace

TEST_CASE("the Fashion-MNIST model trains the same on 1, 2 and 4 ranks as on one process") {
  const auto data = fashion_mnist::load(fashion_mnist::split::train);
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    auto ref = fmnist::make_model(3, hidden);
    test::reference_sgd opt(ref, sgd);
    for (int s = 0; s < steps; ++s) {
      auto b = global_batch(data, s, world);
      auto ce = ddp::nn::softmax_cross_entropy(ref.forward(b.x), b.y);
      ref.backward(ce.grad, {});
      opt.step();
    }
    const auto expected = test::parameter_values(ref);
    auto ranks = ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
      auto m = fmnist::make_model(3, hidden);
      m.layer<1>().synchronize_statistics(ddp::nn::sum_over_ranks(comm));
      m.layer<4>().synchronize_statistics(ddp::nn::sum_over_ranks(comm));
      ddp::host::device dev;
      ddp::trainer<fmnist::model, ddp::bucket_cap<64 << 10>> trainer(m, comm, dev, sgd);
      for (int s = 0; s < steps; ++s) {
        auto g = global_batch(data, s, world);
        const auto r = static_cast<std::size_t>(comm.rank());
        fashion_mnist::batch mine{ddp::nn::slice_rows(g.x, r * per_rank, (r + 1) * per_rank),
                                  std::vector<std::int32_t>(g.y.begin() + static_cast<std::ptrdiff_t>(r * per_rank),
                                                            g.y.begin() + static_cast<std::ptrdiff_t>((r + 1) * per_rank))};
        trainer.step([&](auto& rep) { rep.backward(ddp::nn::softmax_cross_entropy(rep.forward(mine.x), mine.y).grad); });
      }
      return test::parameter_values(m);
    });
    for (const auto& r : ranks) CHECK(test::max_relative_error(r, expected) <= 1e-5);
  }
}

}  // namespace trainer_real_model_equivalence_test
