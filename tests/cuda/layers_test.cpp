// The GPU building blocks against their host twins (each host layer is checked against finite
// differences in tests/nn/layers_test.cpp): the same seeds and inputs give the same outputs,
// input gradients and parameter gradients, up to float rounding (nvcc contracts to FMA).
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "ddp/core/random.hpp"
#include "ddp/cuda/device.hpp"
#include "ddp/nn/cuda/embedding.hpp"
#include "ddp/nn/cuda/gelu.hpp"
#include "ddp/nn/cuda/layer_norm.hpp"
#include "ddp/nn/cuda/linear.hpp"
#include "ddp/nn/cuda/relu.hpp"
#include "ddp/nn/cuda/residual.hpp"
#include "ddp/nn/embedding.hpp"
#include "ddp/nn/gelu.hpp"
#include "ddp/nn/layer_norm.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/relu.hpp"
#include "ddp/nn/residual.hpp"
#include "ddp/nn/sequential.hpp"

namespace {

namespace g = ddp::nn::cuda;

ddp::nn::matrix random_matrix(std::size_t r, std::size_t c, std::uint64_t seed, float scale = 1.0f) {
  ddp::splitmix64 rng(seed);
  ddp::nn::matrix m(r, c);
  for (auto& v : m.data) v = rng.uniform(-scale, scale);
  return m;
}

void check_close(const std::vector<float>& gpu, const std::vector<float>& host, const char* what) {
  REQUIRE(gpu.size() == host.size());
  for (std::size_t i = 0; i < host.size(); ++i) {
    INFO(what, "[", i, "]");
    CHECK(gpu[i] == doctest::Approx(host[i]).epsilon(1e-5).scale(1.0));
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
