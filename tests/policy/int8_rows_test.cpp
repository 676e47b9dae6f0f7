// comm_hook::int8_rows: the averaged gradient of every element within its documented bound of the
// exact f32 average (the mean over the ranks of its row's largest magnitude / 254), every rank
// the same bits, and a quarter of f32's bytes at 2 ranks.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/policy/int8_rows.hpp"
#include "trainer/counting_communicator.hpp"
#include "trainer/test_model.hpp"

namespace policy_int8_rows_test {

namespace {

using grads_t = std::vector<std::vector<float>>;

grads_t gradients_of(test::mlp& m) {
  grads_t out;
  for (auto& p : m.parameters()) {
    auto g = p.grad.as<float>();
    out.emplace_back(g.begin(), g.end());
  }
  return out;
}

// One step under optim::external (the averaged gradients are left in the module); each rank's
// own gradients too, from a copy of the model outside the trainer.
template <class Hook>
std::vector<grads_t> averaged(int world, std::vector<grads_t>* own, double* bytes) {
  std::mutex mutex;
  if (own) own->assign(static_cast<std::size_t>(world), {});
  return ddp::inproc::launch(world, [&](ddp::inproc::communicator& inner) {
    test::counting_communicator<ddp::inproc::communicator> comm(inner);
    const auto global = test::make_batch(8 * static_cast<std::size_t>(world), 77);
    const auto r = static_cast<std::size_t>(comm.rank());
    const auto mine = global.rows(r * 8, (r + 1) * 8);
    if (own) {
      auto copy = test::make_mlp(5);
      copy.backward(ddp::nn::softmax_cross_entropy(copy.forward(mine.x), mine.y).grad, ddp::ready_sink{});
      std::lock_guard lock(mutex);
      (*own)[r] = gradients_of(copy);
    }
    auto model = test::make_mlp(5);
    ddp::host::device dev;
    ddp::trainer<test::mlp, Hook, ddp::optim::external, ddp::bucket_cap<256>,
                 ddp::use_communicator<decltype(comm)>> trainer(model, comm, dev);
    const double before = comm.bytes().all_reduce + comm.bytes().all_gather;
    trainer.step([&](auto& rep) { rep.backward(ddp::nn::softmax_cross_entropy(rep.forward(mine.x), mine.y).grad); });
    if (bytes && r == 0) *bytes = comm.bytes().all_reduce + comm.bytes().all_gather - before;
    return gradients_of(model);
  });
}

}  // namespace

TEST_CASE("comm_hook::int8_rows: every element within the mean over the ranks of its row's largest magnitude / 254") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    std::vector<grads_t> own;
    const auto exact = averaged<ddp::comm_hook::none>(world, nullptr, nullptr);
    const auto hooked = averaged<ddp::comm_hook::int8_rows>(world, &own, nullptr);
    for (const auto& rank : hooked) CHECK(rank == hooked[0]);
    auto model = test::make_mlp(5);
    auto params = model.parameters();
    double worst = 0.0, largest_error = 0.0;
    for (std::size_t t = 0; t < params.size(); ++t) {
      const auto& shape = params[t].value.shape;
      const std::size_t cols = shape.size() > 1 ? static_cast<std::size_t>(params[t].value.numel() / shape[0]) : 0;
      const std::size_t n = exact[0][t].size(), row = cols ? cols : n;
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t first = i / row * row;
        double bound = 0.0;
        for (const auto& g : own) {
          float m = 0.0f;
          for (std::size_t j = first; j < first + row; ++j) m = std::max(m, std::fabs(g[t][j]));
          bound += m / 254.0 / world;
        }
        bound = bound * (1 + 1e-5) + 1e-12;
        const double error = std::fabs(static_cast<double>(hooked[0][t][i]) - exact[0][t][i]);
        largest_error = std::max(largest_error, error);
        worst = std::max(worst, error / bound);
        CHECK(error <= bound);
      }
    }
    CHECK(largest_error > 0.0);  // it does round
    MESSAGE("int8_rows, world ", world, ": largest error ", largest_error, ", at most ", worst, " of its bound");
  }
}

TEST_CASE("comm_hook::int8_rows sends about a quarter of f32's bytes at 2 ranks") {
  double f32 = 0, int8 = 0;
  averaged<ddp::comm_hook::none>(2, nullptr, &f32);
  averaged<ddp::comm_hook::int8_rows>(2, nullptr, &int8);
  CAPTURE(f32);
  CAPTURE(int8);
  CHECK(int8 < f32 * 0.45);  // a scale per row of 12-16 elements adds a third to a quarter
}

TEST_CASE("comm_hook::int8_rows: a row holding a NaN or an infinity averages to NaN, the other rows as usual") {
  using hook = ddp::comm_hook::int8_rows;
  const std::vector<ddp::comm_hook::tensor_layout> tensors{{0, 2, 3}};  // a 2 x 3 matrix
  const auto rows = hook::rows_of(tensors, 8);                          // two rows and the padding
  REQUIRE(rows.size() == 3);
  const float x[8] = {1.0f, -2.0f, 0.5f, std::numeric_limits<float>::infinity(), 1.0f, 2.0f, 0.0f, 0.0f};
  const std::size_t bytes = hook::message_bytes(rows.size(), 8);
  std::vector<std::uint8_t> message(bytes);
  hook::quantize(x, rows, message.data());
  float mean[8];
  hook::average(message.data(), bytes, 1, rows, mean, 8);
  CHECK(mean[1] == -2.0f);  // the row's largest magnitude is exact
  CHECK(std::fabs(mean[2] - 0.5f) <= 2.0f / 254.0f);
  for (int i = 3; i < 6; ++i) CHECK(std::isnan(mean[i]));
  CHECK(mean[6] == 0.0f);
}

}  // namespace policy_int8_rows_test
