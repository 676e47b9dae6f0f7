// Every reference layer's backward against central finite differences of its forward
// (ddp::nn::check_gradients), and the building blocks: residual, layer_norm, gelu, embedding.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "nn/gradient_checks.hpp"
#include "ddp/core/random.hpp"
#include "ddp/host/vector_math.hpp"
#include "ddp/nn/batch_norm.hpp"
#include "ddp/nn/blas.hpp"
#include "ddp/nn/check_gradients.hpp"
#include "ddp/nn/cross_entropy.hpp"
#include "ddp/nn/dropout.hpp"
#include "ddp/nn/embedding.hpp"
#include "ddp/nn/gelu.hpp"
#include "ddp/nn/layer_norm.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/relu.hpp"
#include "ddp/nn/residual.hpp"
#include "ddp/nn/saved_stack.hpp"
#include "ddp/nn/sequential.hpp"

namespace {

using nn_test::random_matrix;

using nn_test::require_gradients;

}  // namespace

TEST_CASE("linear backward matches finite differences") {
  ddp::nn::linear l(5, 4, 3);
  require_gradients(l, random_matrix(3, 5, 1));
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
  require_gradients(r, x);
}

TEST_CASE("batch_norm backward matches finite differences, with batch statistics and frozen") {
  ddp::nn::batch_norm bn(4);
  auto g = bn.params()[0].value();
  for (std::size_t c = 0; c < 4; ++c) g[c] = 0.5f + 0.25f * static_cast<float>(c);
  require_gradients(bn, random_matrix(6, 4, 3, 2.0f));
  ddp::nn::batch_norm frozen(4);
  frozen.set_mode(ddp::nn::batch_norm::mode::frozen);
  require_gradients(frozen, random_matrix(6, 4, 4, 2.0f));
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

namespace {

// A linear layer whose backward adds a wrong amount to one weight's gradient.
struct miscounting_linear : ddp::nn::linear {
  miscounting_linear() : ddp::nn::linear(3, 2, 4) {}
  ddp::nn::matrix backward(const ddp::nn::matrix& dy, bool need_dx) {
    auto dx = ddp::nn::linear::backward(dy, need_dx);
    params()[0].grad()[4] += 0.5f;  // weight[1, 1]
    return dx;
  }
};

// A linear layer whose backward assigns its weight's gradient instead of adding to it.
struct assigning_linear : ddp::nn::linear {
  assigning_linear() : ddp::nn::linear(3, 2, 4) {}
  ddp::nn::matrix backward(const ddp::nn::matrix& dy, bool need_dx) {
    auto w = params()[0].grad();
    std::fill(w.begin(), w.end(), 0.0f);
    return ddp::nn::linear::backward(dy, need_dx);
  }
};

}  // namespace

TEST_CASE("check_gradients names a parameter whose backward assigns its gradient instead of accumulating it") {
  assigning_linear bad;
  const auto report = ddp::nn::check_gradients(bad, random_matrix(4, 3, 11));
  CHECK_FALSE(report);
  CHECK(report.mismatches.empty());  // each single backward is right
  CHECK(report.not_accumulated == std::vector<std::string>{"weight"});
  CHECK(report.message().find("a second backward did not add to the first gradient of 'weight'") != std::string::npos);
}

TEST_CASE("check_gradients names the element that disagrees with both values, samples large tensors, keeps "
          "accumulated gradients") {
  miscounting_linear bad;
  const auto x = random_matrix(4, 3, 11);
  bad.params()[1].grad()[0] = 7.0f;  // accumulated before the check
  const auto report = ddp::nn::check_gradients(bad, x);
  CHECK_FALSE(report);
  CHECK(report.checked == 12 + 6 + 2);
  REQUIRE(report.mismatches.size() == 1);
  CHECK(report.mismatches[0].tensor == "weight");
  CHECK(report.mismatches[0].where() == "weight[1, 1]");
  CHECK(report.mismatches[0].analytic - report.mismatches[0].numeric == doctest::Approx(0.5).epsilon(1e-3));
  CHECK(report.message().find("1 of 20 elements disagree") != std::string::npos);
  CHECK(bad.params()[1].grad()[0] == 7.0f);
  CHECK_THROWS_WITH_AS(report.throw_if_failed(), doctest::Contains("weight[1, 1]: analytic"), ddp::error);

  ddp::nn::linear big(40, 30, 5);
  ddp::nn::gradient_check_options sampled;
  sampled.max_elements = 10;
  sampled.check_input = false;
  const auto some = ddp::nn::check_gradients(big, random_matrix(2, 40, 12), sampled);
  CHECK(some.passed());
  CHECK(some.checked == 10 + 10);

  ddp::nn::linear half(3, 2, 6);
  half.params()[0].cast(ddp::dtype::bf16);
  CHECK_THROWS_WITH_AS(ddp::nn::check_gradients(half, x), doctest::Contains("cast(ddp::dtype::f32) first"), ddp::error);
}

TEST_CASE("sequential's backward, input gradient included, matches finite differences") {
  ddp::nn::sequential m(ddp::nn::linear(5, 6, 1), ddp::nn::relu(), ddp::nn::linear(6, 3, 2));
  m.eval();
  ddp::nn::gradient_check_options smaller_step;
  smaller_step.step = 1e-3;  // the relu's inputs stay on one side of 0
  require_gradients(m, random_matrix(4, 5, 13), smaller_step);
  CHECK_FALSE(m.training());  // the check puts the mode back
}

TEST_CASE("layer_norm normalises each sample over its features, as PyTorch's LayerNorm, and its backward matches "
          "finite differences") {
  ddp::nn::layer_norm ln(4);
  ddp::nn::matrix x(2, 4);
  x.data = {1, 2, 3, 6, -1, -1, -1, -1};
  const auto y = ln.forward(x, false);
  CHECK(y(0, 0) == doctest::Approx((1 - 3) / std::sqrt(3.5 + 1e-5)));
  CHECK(y(0, 3) == doctest::Approx((6 - 3) / std::sqrt(3.5 + 1e-5)));
  CHECK(y(1, 2) == 0.0f);  // a constant row: x - mean is 0
  CHECK(ln.buffer_refs("").empty());
  auto g = ln.params()[0].value();
  auto b = ln.params()[1].value();
  for (std::size_t c = 0; c < 4; ++c) g[c] = 0.5f + 0.25f * static_cast<float>(c), b[c] = 0.1f * static_cast<float>(c);
  require_gradients(ln, random_matrix(3, 4, 14, 2.0f));
  CHECK_THROWS_AS(ln.forward(random_matrix(2, 5, 1), false), std::invalid_argument);
}

TEST_CASE("gelu is the exact (erf) GELU, and its backward matches finite differences") {
  ddp::nn::gelu act;
  ddp::nn::matrix x(1, 3);
  x.data = {1.0f, -1.0f, 0.0f};
  const auto y = act.forward(x, false);
  CHECK(y(0, 0) == doctest::Approx(0.8413447460685429));
  CHECK(y(0, 1) == doctest::Approx(-0.15865525393145707));
  CHECK(y(0, 2) == 0.0f);
  require_gradients(act, random_matrix(3, 5, 15, 3.0f));
}

TEST_CASE("the f32 e^x, erfc, Phi and phi of the host layers' loops stay within their stated error of double") {
  ddp::splitmix64 rng(31);
  double exp_ulps = 0, erfc_rel = 0, cdf_rel = 0, cdf_abs = 0, pdf_rel = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = rng.uniform(-87.0f, 88.0f);
    const double e = std::exp(static_cast<double>(x));
    const auto want = static_cast<float>(e);
    const double ulp = std::nextafter(want, INFINITY) - want;
    exp_ulps = std::max(exp_ulps, std::fabs(ddp::host::exp_f32(x) - e) / ulp);
    const float z = rng.uniform(0.0f, 5.0f), n = rng.uniform(-5.0f, 5.0f);
    const double erfc = std::erfc(static_cast<double>(z));
    erfc_rel = std::max(erfc_rel, std::fabs(ddp::host::erfc_nonnegative_f32(z) - erfc) / erfc);
    const double cdf = 0.5 * std::erfc(-static_cast<double>(n) / std::sqrt(2.0));
    if (n <= 0)
      cdf_rel = std::max(cdf_rel, std::fabs(ddp::host::normal_cdf_f32(n) - cdf) / cdf);
    else
      cdf_abs = std::max(cdf_abs, std::fabs(ddp::host::normal_cdf_f32(n) - cdf));
    const double pdf = 0.3989422804014327 * std::exp(-0.5 * static_cast<double>(n) * n);
    pdf_rel = std::max(pdf_rel, std::fabs(ddp::host::normal_pdf_f32(n) - pdf) / pdf);
  }
  CAPTURE(exp_ulps);
  CAPTURE(erfc_rel);
  CAPTURE(cdf_rel);
  CAPTURE(cdf_abs);
  CAPTURE(pdf_rel);
  CHECK(exp_ulps <= 2.0);
  CHECK(erfc_rel <= 3e-6);  // x <= 5: x^2 rounded to f32 is most of it
  CHECK(cdf_rel <= 3e-6);
  CHECK(cdf_abs <= 3e-7);
  CHECK(pdf_rel <= 1e-6);
  CHECK(ddp::host::exp_f32(-104.0f) == 0.0f);
  CHECK(ddp::host::exp_f32(-100.0f) == doctest::Approx(std::exp(-100.0)).epsilon(1e-3));  // subnormal
  CHECK(ddp::host::exp_f32(-INFINITY) == 0.0f);
  CHECK(ddp::host::exp_f32(89.0f) == INFINITY);
  CHECK(std::isnan(ddp::host::exp_f32(NAN)));
  CHECK(ddp::host::exp_f32(0.0f) == 1.0f);
  CHECK(ddp::host::normal_cdf_f32(-20.0f) == 0.0f);
  CHECK(ddp::host::normal_cdf_f32(20.0f) == 1.0f);
  // Fixed lanes: the same sum whatever the row's length splits into.
  std::vector<float> row(37);
  for (auto& v : row) v = rng.uniform(-1.0f, 1.0f);
  float by_lanes[ddp::host::sum_lanes] = {};
  for (std::size_t j = 0; j < row.size(); ++j) by_lanes[j % ddp::host::sum_lanes] += row[j];
  ddp::host::lane_sums lanes;
  std::copy(by_lanes, by_lanes + ddp::host::sum_lanes, lanes.lane);
  CHECK(ddp::host::lane_sum(row.size(), [&](std::size_t j) { return row[j]; }) == lanes.total());
  CHECK(ddp::host::lane_max(row.size(), [&](std::size_t j) { return row[j]; }) ==
        *std::max_element(row.begin(), row.end()));
}

TEST_CASE("a layer's saved entries come back last in, first out, and their storage serves the next forward") {
  ddp::nn::saved_stack<ddp::nn::matrix> saved;
  const auto a = random_matrix(4, 3, 1), b = random_matrix(2, 5, 2);
  saved.push_copy(a);
  saved.push_copy(b);
  const float* storage = nullptr;
  {
    const auto top = saved.pop("test");
    CHECK(top->data == b.data);
    storage = top->data.data();
  }
  {
    const auto next = saved.pop("test");
    CHECK(next->data == a.data);
    CHECK(next->rows == 4);
  }
  CHECK_THROWS_WITH_AS((void)saved.pop("test layer"), doctest::Contains("test layer backward without a matching training forward"),
                       std::logic_error);
  saved.push_copy(random_matrix(2, 2, 3));  // into a's storage, the last to come back
  const auto c = random_matrix(2, 5, 4);
  saved.push_copy(c);  // into b's: as large
  CHECK(saved.size() == 2);
  CHECK(saved.back().data.data() == storage);
  CHECK(saved.back().data == c.data);
  ddp::nn::saved_stack<ddp::nn::matrix> copy = saved;
  CHECK(copy.size() == saved.size());
}

TEST_CASE("embedding looks rows up by index, adds repeated indices' gradients in order, names a bad index") {
  ddp::nn::embedding e(5, 3, 21);
  CHECK(e.params()[0].ref("emb.").name == "emb.weight");
  CHECK(e.params()[0].ref("").value.shape == ddp::shape_t{5, 3});
  const std::vector<std::int32_t> ids{4, 1, 4, 0};
  const auto y = e.forward(ids, true);
  REQUIRE(y.rows == 4);
  const auto w = e.params()[0].value();
  for (std::size_t c = 0; c < 3; ++c) {
    CHECK(y(0, c) == w[4 * 3 + c]);
    CHECK(y(2, c) == w[4 * 3 + c]);
    CHECK(y(1, c) == w[1 * 3 + c]);
  }
  ddp::nn::matrix dy(4, 3);
  for (std::size_t i = 0; i < dy.size(); ++i) dy.data[i] = static_cast<float>(i);
  e.backward(dy);
  const auto g = e.params()[0].grad();
  CHECK(g[4 * 3 + 1] == 1.0f + 7.0f);  // rows 0 and 2
  CHECK(g[1 * 3 + 2] == 5.0f);
  CHECK(g[2 * 3 + 0] == 0.0f);  // not looked up
  CHECK(g[0 * 3 + 0] == 9.0f);
  std::fill(g.begin(), g.end(), 0.0f);
  require_gradients(e, ids);
  CHECK_THROWS_WITH_AS(e.forward(std::vector<std::int32_t>{0, 5}, true),
                       doctest::Contains("index 5 at position 1 is outside the table's rows [0, 5)"), ddp::error);
  ddp::nn::embedding same(5, 3, 21);
  CHECK(std::equal(w.begin(), w.end(), same.params()[0].value().begin()));
}

TEST_CASE("residual: y = x + f(x) inside a sequential, PyTorch names, ready indices and bound gradients of the "
          "branch, backward through both paths") {
  ddp::nn::sequential m(ddp::nn::linear(4, 6, 1),
                        ddp::nn::residual(ddp::nn::layer_norm(6), ddp::nn::linear(6, 6, 2), ddp::nn::gelu(),
                                          ddp::nn::linear(6, 6, 3)),
                        ddp::nn::relu(), ddp::nn::linear(6, 2, 4));
  const auto params = m.parameters();
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "1.0.weight", "1.0.bias", "1.1.weight", "1.1.bias",
                                          "1.3.weight", "1.3.bias", "3.weight", "3.bias"});
  CHECK(m.parameter_count() == 10);
  std::vector<float> storage(6, 0.0f);
  m.bind_gradient(7, storage.data());  // 1.3.bias
  CHECK(m.parameters()[7].grad.data == storage.data());
  std::vector<std::size_t> order;
  auto record = [&](std::size_t i) { order.push_back(i); };
  (void)m.forward(random_matrix(3, 4, 16));
  m.backward(ddp::nn::matrix(3, 2, 1.0f), ddp::ready_sink(record));
  CHECK(order == std::vector<std::size_t>{8, 9, 2, 3, 4, 5, 6, 7, 0, 1});
  CHECK(storage != std::vector<float>(6, 0.0f));
  m.bind_gradient(7, nullptr);

  // The skip path alone: a branch that outputs zeros leaves y = x and dx = dy.
  ddp::nn::residual skip(ddp::nn::linear(3, 3, 5));
  for (auto& p : skip.params()) std::fill(p.target().value().begin(), p.target().value().end(), 0.0f);
  const auto x = random_matrix(2, 3, 17);
  CHECK(skip.forward(x, true).data == x.data);
  const auto dy = random_matrix(2, 3, 18);
  CHECK(skip.backward(dy, true).data == dy.data);

  ddp::nn::gradient_check_options smaller_step;
  smaller_step.step = 1e-3;  // the relu's inputs stay on one side of 0
  require_gradients(m, random_matrix(3, 4, 19), smaller_step);
}

TEST_CASE("residual: a branch that changes the width is named with the fix, and nested residuals nest their names") {
  ddp::nn::residual wrong(ddp::nn::linear(4, 3, 1));
  CHECK_THROWS_WITH_AS(wrong.forward(random_matrix(2, 4, 1), false),
                       doctest::Contains("the branch maps 2 x 4 to 2 x 3; y = x + f(x) needs f to keep the shape"),
                       ddp::error);
  ddp::nn::residual nested(ddp::nn::relu(), ddp::nn::residual(ddp::nn::linear(3, 3, 2)));
  REQUIRE(nested.params().size() == 2);
  CHECK(nested.params()[0].ref("0.").name == "0.1.0.weight");
  CHECK(nested.params()[1].name() == "1.0.bias");
  require_gradients(nested, random_matrix(2, 3, 20));
}
