// The GPU building blocks against their host twins (each host layer is checked against finite
// differences in tests/nn/layers_test.cpp): the same seeds and inputs give the same outputs,
// input gradients and parameter gradients, up to float rounding (nvcc contracts to FMA).
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "ddp/core/random.hpp"
#include "ddp/cuda/device.hpp"
#include "ddp/nn/attention.hpp"
#include "ddp/nn/cuda/attention.hpp"
#include "ddp/nn/cuda/embedding.hpp"
#include "ddp/nn/cuda/gelu.hpp"
#include "ddp/nn/cuda/layer_norm.hpp"
#include "ddp/nn/cuda/linear.hpp"
#include "ddp/nn/cuda/position_embedding.hpp"
#include "ddp/nn/cuda/relu.hpp"
#include "ddp/nn/cuda/residual.hpp"
#include "ddp/nn/cuda/sequence_cross_entropy.hpp"
#include "ddp/nn/cuda/transformer_block.hpp"
#include "ddp/nn/embedding.hpp"
#include "ddp/nn/gelu.hpp"
#include "ddp/nn/layer_norm.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/position_embedding.hpp"
#include "ddp/nn/relu.hpp"
#include "ddp/nn/residual.hpp"
#include "ddp/nn/sequence_cross_entropy.hpp"
#include "ddp/nn/sequential.hpp"
#include "ddp/nn/transformer_block.hpp"

namespace {

namespace g = ddp::nn::cuda;

ddp::nn::matrix random_matrix(std::size_t r, std::size_t c, std::uint64_t seed, float scale = 1.0f) {
  ddp::splitmix64 rng(seed);
  ddp::nn::matrix m(r, c);
  for (auto& v : m.data) v = rng.uniform(-scale, scale);
  return m;
}

void check_close(const std::vector<float>& gpu, const std::vector<float>& host, const char* what,
                 double epsilon = 1e-5) {
  REQUIRE(gpu.size() == host.size());
  for (std::size_t i = 0; i < host.size(); ++i) {
    INFO(what, "[", i, "]");
    CHECK(gpu[i] == doctest::Approx(host[i]).epsilon(epsilon).scale(1.0));
  }
}

// One training forward and backward of each: outputs, input gradients and parameter gradients.
template <class Host, class Gpu>
void compare_layers(Host& host, Gpu& gpu, ddp::cuda::device& dev, const ddp::nn::matrix& x, std::uint64_t seed) {
  const auto y = host.forward(x, true);
  const auto gy = gpu.forward(g::matrix::from_host(dev, x), true);
  check_close(gy.to_host().data, y.data, "output");
  const auto dy = random_matrix(y.rows, y.cols, seed);
  const auto dx = host.backward(dy, true);
  const auto gdx = gpu.backward(g::matrix::from_host(dev, dy), true);
  check_close(gdx.to_host().data, dx.data, "input gradient");
  auto hp = host.params();
  auto gp = gpu.params();
  REQUIRE(hp.size() == gp.size());
  for (std::size_t k = 0; k < hp.size(); ++k) {
    std::vector<float> grad(gp[k].size());
    dev.copy_to_host(grad.data(), gp[k].grad(), grad.size() * sizeof(float));
    check_close(grad, std::vector<float>(hp[k].grad().begin(), hp[k].grad().end()), "parameter gradient");
  }
}

}  // namespace

TEST_CASE("cuda layer_norm equals the host's: output, input and parameter gradients") {
  ddp::cuda::device dev;
  ddp::nn::layer_norm host(24);
  g::layer_norm gpu(dev, 24);
  compare_layers(host, gpu, dev, random_matrix(33, 24, 1, 3.0f), 2);
}

TEST_CASE("cuda gelu equals the host's (exact erf GELU)") {
  ddp::cuda::device dev;
  ddp::nn::gelu host;
  g::gelu gpu;
  compare_layers(host, gpu, dev, random_matrix(17, 40, 3, 4.0f), 4);
}

TEST_CASE("cuda embedding: the same table from the same seed, lookups, a deterministic backward over repeated "
          "indices, a bad index named") {
  ddp::cuda::device dev;
  ddp::nn::embedding host(50, 16, 7);
  g::embedding gpu(dev, 50, 16, 7);
  std::vector<float> table(50 * 16);
  dev.copy_to_host(table.data(), gpu.params()[0].value(), table.size() * sizeof(float));
  CHECK(table == std::vector<float>(host.params()[0].value().begin(), host.params()[0].value().end()));
  std::vector<std::int32_t> ids;
  ddp::splitmix64 rng(5);
  for (int i = 0; i < 200; ++i) ids.push_back(static_cast<std::int32_t>(rng.below(10)));  // many repeats
  CHECK(gpu.forward(ids, true).to_host().data == host.forward(ids, true).data);
  const auto dy = random_matrix(ids.size(), 16, 6);
  host.backward(dy);
  gpu.backward(g::matrix::from_host(dev, dy));
  std::vector<float> grad(50 * 16);
  dev.copy_to_host(grad.data(), gpu.params()[0].grad(), grad.size() * sizeof(float));
  CHECK(grad == std::vector<float>(host.params()[0].grad().begin(), host.params()[0].grad().end()));  // same order
  CHECK_THROWS_WITH_AS(gpu.forward(std::vector<std::int32_t>{-1}, true), doctest::Contains("index -1 at position 0"),
                       ddp::error);
}

TEST_CASE("a residual block of cuda layers in a sequential equals the host's, names and ready order included") {
  ddp::cuda::device dev;
  ddp::nn::sequential host(ddp::nn::linear(8, 12, 1),
                           ddp::nn::residual(ddp::nn::layer_norm(12), ddp::nn::linear(12, 12, 2), ddp::nn::gelu()),
                           ddp::nn::relu(), ddp::nn::linear(12, 3, 3));
  ddp::nn::sequential gpu(g::linear(dev, 8, 12, 1),
                          ddp::nn::residual(g::layer_norm(dev, 12), g::linear(dev, 12, 12, 2), g::gelu()), g::relu(),
                          g::linear(dev, 12, 3, 3));
  host.compute_input_gradient();
  gpu.compute_input_gradient();
  const auto x = random_matrix(20, 8, 9);
  const auto y = host.forward(x);
  const auto gy = gpu.forward(g::matrix::from_host(dev, x));
  check_close(gy.to_host().data, y.data, "output");
  const auto dy = random_matrix(20, 3, 10);
  std::vector<std::size_t> host_order, gpu_order;
  auto record_host = [&](std::size_t i) { host_order.push_back(i); };
  auto record_gpu = [&](std::size_t i) { gpu_order.push_back(i); };
  const auto dx = host.backward(dy, ddp::ready_sink(record_host));
  const auto gdx = gpu.backward(g::matrix::from_host(dev, dy), ddp::ready_sink(record_gpu));
  check_close(gdx.to_host().data, dx.data, "input gradient");
  CHECK(gpu_order == host_order);
  const auto hp = host.parameters();
  const auto gp = gpu.parameters();
  REQUIRE(hp.size() == gp.size());
  for (std::size_t k = 0; k < hp.size(); ++k) {
    CHECK(gp[k].name == hp[k].name);
    CHECK(gp[k].grad.device == ddp::device_id::cuda(dev.ordinal()));
    std::vector<float> grad(gp[k].grad.numel());
    dev.copy_to_host(grad.data(), gp[k].grad.data, grad.size() * sizeof(float));
    const auto h = hp[k].grad.as<float>();
    check_close(grad, std::vector<float>(h.begin(), h.end()), "parameter gradient");
  }
}

namespace {

// The parameter behind a layer's view of it (a branch's nested_parameter, or the parameter).
template <class P>
auto& target_of(P& p) {
  if constexpr (requires { p.target(); }) return p.target();
  else return p;
}

template <class P>
std::vector<float> gpu_values(ddp::cuda::device& dev, P& p, bool grad) {
  auto& t = target_of(p);
  std::vector<float> out(t.size());
  dev.copy_to_host(out.data(), grad ? t.grad() : t.value(), out.size() * sizeof(float));
  return out;
}

// Gives host and GPU layers the same random weights, larger than nanoGPT's N(0, 0.02) start so
// that the softmax is far from uniform; the names and the start values must agree first.
template <class Host, class Gpu>
void same_random_weights(Host& host, Gpu& gpu, ddp::cuda::device& dev, float scale) {
  auto hp = host.params();
  auto gp = gpu.params();
  REQUIRE(hp.size() == gp.size());
  for (std::size_t k = 0; k < hp.size(); ++k) {
    CHECK(gp[k].ref("").name == hp[k].ref("").name);
    auto h = target_of(hp[k]).value();
    CHECK(gpu_values(dev, gp[k], false) == std::vector<float>(h.begin(), h.end()));  // the same seed
    const auto w = random_matrix(1, h.size(), 100 + k, scale).data;
    std::copy(w.begin(), w.end(), h.begin());
    dev.copy_from_host(target_of(gp[k]).value(), w.data(), w.size() * sizeof(float));
  }
}

// compare_layers for layers whose parameters are views (nested_parameter) and whose rows are
// sequences: outputs, input gradients and parameter gradients.
template <class Host, class Gpu>
void compare_sequence_layers(Host& host, Gpu& gpu, ddp::cuda::device& dev, const ddp::nn::matrix& x,
                             std::uint64_t seed, double epsilon) {
  const auto y = host.forward(x, true);
  const auto gy = gpu.forward(g::matrix::from_host(dev, x), true);
  check_close(gy.to_host().data, y.data, "output", epsilon);
  const auto dy = random_matrix(y.rows, y.cols, seed);
  const auto dx = host.backward(dy, true);
  const auto gdx = gpu.backward(g::matrix::from_host(dev, dy), true);
  check_close(gdx.to_host().data, dx.data, "input gradient", epsilon);
  auto hp = host.params();
  auto gp = gpu.params();
  REQUIRE(hp.size() == gp.size());
  for (std::size_t k = 0; k < hp.size(); ++k) {
    INFO(hp[k].ref("").name);
    const auto h = target_of(hp[k]).grad();
    check_close(gpu_values(dev, gp[k], true), std::vector<float>(h.begin(), h.end()), "parameter gradient", epsilon);
  }
}

}  // namespace

TEST_CASE("cuda attention equals the host's, causal and not: names, start, output, input and parameter gradients") {
  ddp::cuda::device dev;
  for (const bool causal : {true, false}) {
    INFO("causal ", causal);
    ddp::nn::attention host(24, 3, 11, causal, 0.5f);
    g::attention gpu(dev, 24, 3, 11, causal, 0.5f);
    same_random_weights(host, gpu, dev, 0.4f);
    host.set_sequence_length(7);
    gpu.set_sequence_length(7);
    compare_sequence_layers(host, gpu, dev, random_matrix(3 * 7, 24, 12), 13, 1e-4);
  }
}

TEST_CASE("cuda attention: a sequence longer than a warp, and the gradient with respect to a future token exactly 0") {
  ddp::cuda::device dev;
  ddp::nn::attention host(16, 2, 21);
  g::attention gpu(dev, 16, 2, 21);
  same_random_weights(host, gpu, dev, 0.4f);
  constexpr std::size_t t = 40;
  host.set_sequence_length(t);
  gpu.set_sequence_length(t);
  compare_sequence_layers(host, gpu, dev, random_matrix(2 * t, 16, 22), 23, 1e-4);
  // d loss / d y at position 0 of each sequence only: no later position's input gets a gradient.
  gpu.forward(g::matrix::from_host(dev, random_matrix(2 * t, 16, 24)), true);
  ddp::nn::matrix dy(2 * t, 16);
  for (std::size_t c = 0; c < 16; ++c) dy.row(0)[c] = dy.row(t)[c] = 1.0f;
  const auto dx = gpu.backward(g::matrix::from_host(dev, dy), true).to_host();
  std::size_t nonzero = 0;
  for (std::size_t r = 0; r < dx.rows; ++r)
    for (std::size_t c = 0; c < 16; ++c) nonzero += r % t != 0 && dx.row(r)[c] != 0.0f;
  CHECK(nonzero == 0);
  CHECK(dx.row(0)[0] != 0.0f);
  g::attention unset(dev, 16, 2, 21);
  CHECK_THROWS_WITH(unset.forward(g::matrix::from_host(dev, random_matrix(6, 16, 1)), false),
                    doctest::Contains("call set_sequence_length(T)"));
}

TEST_CASE("a cuda transformer block equals the host's: names, start, output, input and parameter gradients") {
  ddp::cuda::device dev;
  ddp::nn::transformer_block host(16, 4, 31, true, 0.7f);
  g::transformer_block gpu(dev, 16, 4, 31, true, 0.7f);
  same_random_weights(host, gpu, dev, 0.3f);
  host.set_sequence_length(5);
  gpu.set_sequence_length(5);
  compare_sequence_layers(host, gpu, dev, random_matrix(4 * 5, 16, 32, 2.0f), 33, 1e-4);
}

TEST_CASE("cuda position embedding: the host's table, output and gradient bit for bit, a sequence past its table "
          "named") {
  ddp::cuda::device dev;
  ddp::nn::position_embedding host(9, 12, 41);
  g::position_embedding gpu(dev, 9, 12, 41);
  CHECK(gpu_values(dev, gpu.params()[0], false) ==
        std::vector<float>(host.params()[0].value().begin(), host.params()[0].value().end()));
  host.set_sequence_length(6);
  gpu.set_sequence_length(6);
  for (int pass = 0; pass < 2; ++pass) {  // twice: the gradient accumulates
    const auto x = random_matrix(5 * 6, 12, 42 + pass);
    CHECK(gpu.forward(g::matrix::from_host(dev, x), true).to_host().data == host.forward(x, true).data);
    const auto dy = random_matrix(5 * 6, 12, 44 + pass);
    CHECK(gpu.backward(g::matrix::from_host(dev, dy), true).to_host().data == host.backward(dy, true).data);
  }
  CHECK(gpu_values(dev, gpu.params()[0], true) ==
        std::vector<float>(host.params()[0].grad().begin(), host.params()[0].grad().end()));
  gpu.set_sequence_length(10);
  CHECK_THROWS_WITH_AS(gpu.forward(g::matrix::from_host(dev, random_matrix(10, 12, 1)), false),
                       doctest::Contains("T in [1, 9]"), ddp::error);
}

TEST_CASE("cuda sequence cross-entropy equals the host's, padding sequences weighing nothing") {
  ddp::cuda::device dev;
  constexpr std::size_t sequences = 3, length = 4, vocab = 11;
  const auto logits = random_matrix(sequences * length, vocab, 51, 3.0f);
  std::vector<std::int32_t> targets;
  ddp::splitmix64 rng(52);
  for (std::size_t i = 0; i < sequences * length; ++i) targets.push_back(static_cast<std::int32_t>(rng.below(vocab)));
  const auto device_targets = ddp::cuda::device_vector<std::int32_t>::from_host(dev, targets);
  const auto device_logits = g::matrix::from_host(dev, logits);
  const ddp::sample_weights padded{{1.0f, 0.0f, 1.0f}, 4.0, 2};
  const auto host = ddp::nn::sequence_cross_entropy(logits, targets, padded, length);
  const auto gpu = g::sequence_cross_entropy(device_logits, device_targets, padded, length);
  CHECK(gpu.loss == doctest::Approx(host.loss).epsilon(1e-12));
  CHECK(gpu.loss_sum == doctest::Approx(host.loss_sum).epsilon(1e-12));
  CHECK(gpu.samples == host.samples);
  CHECK(gpu.correct == host.correct);
  check_close(gpu.grad.to_host().data, host.grad.data, "gradient");
  const auto plain = g::sequence_cross_entropy(device_logits, device_targets);
  CHECK(plain.loss == doctest::Approx(ddp::nn::sequence_cross_entropy(logits, targets).loss).epsilon(1e-12));
  CHECK_THROWS_WITH(g::sequence_cross_entropy(device_logits, device_targets, padded, 5),
                    doctest::Contains("not whole sequences of 5 positions"));
}
