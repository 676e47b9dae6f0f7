// Every reference layer's backward against central finite differences of its forward.
#include <doctest/doctest.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

#include "ddp/core/random.hpp"
#include "ddp/nn/batch_norm.hpp"
#include "ddp/nn/blas.hpp"
#include "ddp/nn/cross_entropy.hpp"
#include "ddp/nn/dropout.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/relu.hpp"
#include "ddp/nn/sequential.hpp"

namespace {

ddp::nn::matrix random_matrix(std::size_t r, std::size_t c, std::uint64_t seed, float scale = 1.0f) {
  ddp::splitmix64 rng(seed);
  ddp::nn::matrix m(r, c);
  for (auto& v : m.data) v = rng.uniform(-scale, scale);
  return m;
}

// loss(x) = sum(w . layer(x)): the analytic gradients from one backward of w are compared with
// (loss(v + h) - loss(v - h)) / 2h for every input element and every parameter element.
template <class Layer>
void check_gradients(Layer& layer, const ddp::nn::matrix& x0, double tolerance = 2e-2) {
  const auto y0 = layer.forward(x0, true);
  const auto w = random_matrix(y0.rows, y0.cols, 99);
  for (auto& p : layer.params()) std::fill(p.grad().begin(), p.grad().end(), 0.0f);
  const auto dx = layer.backward(w, true);
  std::vector<std::vector<float>> analytic;
  for (auto& p : layer.params()) analytic.emplace_back(p.grad().begin(), p.grad().end());

  auto loss = [&](const ddp::nn::matrix& x) {
    const auto y = layer.forward(x, true);
    ddp::nn::matrix zero(y.rows, y.cols);
    auto saved = std::vector<std::vector<float>>{};
    for (auto& p : layer.params()) saved.emplace_back(p.grad().begin(), p.grad().end());
    layer.backward(zero, false);  // pops the tape; adds nothing
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += static_cast<double>(w.data[i]) * y.data[i];
    return s;
  };
  auto close = [&](double numeric, double exact) {
    return std::abs(numeric - exact) <= tolerance * std::max(1.0, std::abs(exact));
  };
  const float h = 1e-2f;
  auto x = x0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float keep = x.data[i];
    x.data[i] = keep + h;
    const double up = loss(x);
    x.data[i] = keep - h;
    const double down = loss(x);
    x.data[i] = keep;
    CAPTURE(i);
    CHECK(close((up - down) / (2 * h), dx.data[i]));
  }
  std::size_t k = 0;
  for (auto& p : layer.params()) {
    auto v = p.value();
    for (std::size_t i = 0; i < v.size(); ++i) {
      const float keep = v[i];
      v[i] = keep + h;
      const double up = loss(x0);
      v[i] = keep - h;
      const double down = loss(x0);
      v[i] = keep;
      INFO("parameter ", p.name(), "[", i, "]");
      CHECK(close((up - down) / (2 * h), analytic[k][i]));
    }
    ++k;
  }
}

}  // namespace

TEST_CASE("linear backward matches finite differences") {
  ddp::nn::linear l(5, 4, 3);
  check_gradients(l, random_matrix(3, 5, 1));
}

TEST_CASE("linear initialises as PyTorch: uniform in +-1/sqrt(in), the same for the same seed") {
  ddp::nn::linear a(16, 8, 5), b(16, 8, 5), c(16, 8, 6);
  for (float w : a.params()[0].value()) CHECK(std::abs(w) <= 0.25f);
  CHECK(std::equal(a.params()[0].value().begin(), a.params()[0].value().end(), b.params()[0].value().begin()));
  CHECK_FALSE(std::equal(a.params()[0].value().begin(), a.params()[0].value().end(), c.params()[0].value().begin()));
}

TEST_CASE("relu backward matches finite differences away from the kink") {
  ddp::nn::relu r;
  auto x = random_matrix(3, 6, 2);
  for (auto& v : x.data) v += v > 0 ? 0.1f : -0.1f;
  check_gradients(r, x);
}

TEST_CASE("batch_norm backward matches finite differences, with batch statistics and frozen") {
  ddp::nn::batch_norm bn(4);
  auto g = bn.params()[0].value();
  for (std::size_t c = 0; c < 4; ++c) g[c] = 0.5f + 0.25f * static_cast<float>(c);
  check_gradients(bn, random_matrix(6, 4, 3, 2.0f));
  ddp::nn::batch_norm frozen(4);
  frozen.set_mode(ddp::nn::batch_norm::mode::frozen);
  check_gradients(frozen, random_matrix(6, 4, 4, 2.0f));
}

TEST_CASE("batch_norm keeps running statistics as PyTorch: momentum 0.1, unbiased variance, batch count") {
  ddp::nn::batch_norm bn(1);
  ddp::nn::matrix x(4, 1);
  x.data = {1, 2, 3, 6};  // mean 3, biased var 3.5, unbiased 14/3
  auto y = bn.forward(x, true);
  CHECK(bn.running_mean()[0] == doctest::Approx(0.3));
  CHECK(bn.running_var()[0] == doctest::Approx(0.9 + 0.1 * 14.0 / 3.0));
  CHECK(bn.batches_tracked() == 1);
  CHECK(y(0, 0) == doctest::Approx((1 - 3) / std::sqrt(3.5 + 1e-5)));
  ddp::nn::matrix one(1, 1, 3.0f);
  CHECK(bn.forward(one, false)(0, 0) == doctest::Approx((3 - 0.3) / std::sqrt(0.9 + 0.1 * 14.0 / 3.0 + 1e-5)));
}

TEST_CASE("dropout: seeded per rank and forward, scaled to keep the mean, backward uses the same mask") {
  ddp::nn::dropout a(0.25f, 7, 0), b(0.25f, 7, 0), other_rank(0.25f, 7, 1);
  ddp::nn::matrix x(64, 64, 1.0f);
  auto ya = a.forward(x, true), yb = b.forward(x, true), yr = other_rank.forward(x, true);
  CHECK(ya.data == yb.data);
  CHECK(ya.data != yr.data);
  double mean = 0;
  for (float v : ya.data) {
    CHECK((v == 0.0f || v == doctest::Approx(1.0f / 0.75f)));
    mean += v / static_cast<double>(ya.size());
  }
  CHECK(mean == doctest::Approx(1.0).epsilon(0.05));
  auto dx = a.backward(x, true);
  CHECK(dx.data == ya.data);  // dy of ones through the same mask
  CHECK(a.forward(x, true).data != ya.data);  // the next forward draws a new mask
  CHECK(a.forward(x, false).data == x.data);   // evaluation: identity
  CHECK_THROWS_WITH_AS(ddp::nn::dropout(1.0f, 0, 0), doctest::Contains("p must be in [0, 1)"), std::invalid_argument);
}

TEST_CASE("softmax cross-entropy names a mismatch of logits, labels and weights, and a step without weight") {
  const auto logits = random_matrix(4, 5, 8, 3.0f);
  const std::vector<std::int32_t> labels{0, 3, 4, 1};
  CHECK_THROWS_WITH(ddp::nn::softmax_cross_entropy(logits, std::span(labels).first(3)),
                    "ddp::nn::softmax_cross_entropy: 4 rows of logits but 3 labels");
  const ddp::sample_weights three{{1, 1, 1}, 3.0, 1};
  CHECK_THROWS_WITH(ddp::nn::softmax_cross_entropy(logits, labels, three),
                    "ddp::nn::softmax_cross_entropy: 4 rows of logits but 3 sample weights (pass the batch's own weights)");
  const ddp::sample_weights none{{0, 0, 0, 0}, 0.0, 1};
  CHECK_THROWS_WITH(ddp::nn::softmax_cross_entropy(logits, labels, none),
                    doctest::Contains("the weights' divisor is 0.000000; it must be positive"));
}

TEST_CASE("softmax cross-entropy gradient matches finite differences, accuracy counts arg-max") {
  auto logits = random_matrix(4, 5, 8, 3.0f);
  std::vector<std::int32_t> labels{0, 3, 4, 1};
  auto ce = ddp::nn::softmax_cross_entropy(logits, labels);
  const float h = 1e-3f;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    auto up = logits, down = logits;
    up.data[i] += h;
    down.data[i] -= h;
    const double numeric = (ddp::nn::softmax_cross_entropy(up, labels).loss - ddp::nn::softmax_cross_entropy(down, labels).loss) / (2 * h);
    CHECK(numeric == doctest::Approx(ce.grad.data[i]).epsilon(1e-2));
  }
  std::size_t correct = 0;
  for (std::size_t r = 0; r < 4; ++r)
    correct += static_cast<std::size_t>(std::max_element(logits.row(r), logits.row(r) + 5) - logits.row(r)) ==
               static_cast<std::size_t>(labels[r]);
  CHECK(ce.correct == correct);
  CHECK_THROWS_WITH_AS(ddp::nn::softmax_cross_entropy(logits, std::vector<std::int32_t>{0, 1, 9, 2}),
                       doctest::Contains("label 9 outside [0, 5)"), std::invalid_argument);
}

TEST_CASE("sequential: PyTorch names, ready reports in reverse layer order, bound gradients") {
  ddp::nn::sequential m(ddp::nn::linear(3, 4, 1), ddp::nn::relu(), ddp::nn::linear(4, 2, 2));
  auto params = m.parameters();
  REQUIRE(params.size() == 4);
  CHECK(params[0].name == "0.weight");
  CHECK(params[3].name == "2.bias");
  std::vector<float> bias_storage(4, 0.0f);
  m.bind_gradient(1, bias_storage.data());
  std::vector<std::size_t> order;
  auto record = [&](std::size_t i) { order.push_back(i); };
  auto y = m.forward(random_matrix(2, 3, 5));
  m.backward(ddp::nn::matrix(2, 2, 1.0f), ddp::ready_sink(record));
  CHECK(order == std::vector<std::size_t>{2, 3, 0, 1});
  CHECK(m.parameters()[1].grad.data == bias_storage.data());
  CHECK(bias_storage != std::vector<float>(4, 0.0f));
  CHECK_THROWS_AS(m.backward(ddp::nn::matrix(2, 2), {}), std::logic_error);  // no pending forward
}

// scripts/test.sh and scripts/run-example.sh set OPENBLAS_CORETYPE (scripts/openblas-env.sh):
// then OpenBLAS must run those kernels. Without it, a fall-back to Prescott on a CPU that suits
// better kernels must be reported with the fix.
TEST_CASE("OpenBLAS runs the kernels the environment names, or the layers say how to fix a Prescott fall-back") {
  auto lower = [](std::string s) {
    for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  const std::string core = lower(openblas_get_corename());
  const auto warning = ddp::nn::blas::kernel_warning();
  if (const char* chosen = std::getenv("OPENBLAS_CORETYPE")) {
    CHECK(core == lower(chosen));
    CHECK_FALSE(warning);
  } else if (core == "prescott" && ddp::nn::blas::suited_core()) {
    REQUIRE(warning);
    CHECK(warning->find("OPENBLAS_CORETYPE=" + *ddp::nn::blas::suited_core()) != std::string::npos);
  } else {
    CHECK_FALSE(warning);
  }
}

TEST_CASE("a buffer may have any number of dimensions, its shape travels in its ref") {
  ddp::nn::buffer<float> cov("running_cov", ddp::shape_t{3, 4}, 0.5f);
  CHECK(cov.read().size() == 12);
  const auto ref = cov.ref("layer.");
  CHECK(ref.name == "layer.running_cov");
  CHECK(ref.value.shape == ddp::shape_t{3, 4});
  CHECK(ref.value.numel() == 12);
  CHECK(ref.version == &cov.version());
  ddp::nn::buffer<std::int64_t> count("count", 1);
  CHECK(count.ref("").value.shape == ddp::shape_t{1});
  CHECK_THROWS_AS(ddp::nn::buffer<float>("bad", ddp::shape_t{2, -1}), std::invalid_argument);
}

TEST_CASE("a buffer owns its version: every write bumps it, reads do not, saves are released in order") {
  ddp::nn::buffer<float> stat("running_stat", 4, 0.0f);
  const auto start = stat.version().value();
  (void)stat.read();
  CHECK(stat.version().value() == start);
  stat.write()[0] = 1.0f;
  CHECK(stat.version().value() == start + 1);
  CHECK(stat.read()[0] == 1.0f);

  (void)stat.read_for_backward();  // forward: backward will read it at this version
  CHECK(stat.version().innermost_saved() == stat.version().value());
  stat.write()[1] = 2.0f;  // a write between forward and backward: the trainer sees the saved one is stale
  CHECK(stat.version().innermost_saved() != stat.version().value());
  stat.release_after_backward();
  CHECK_FALSE(stat.version().innermost_saved());
}
