#pragma once
// The example's model: 784-512-512-10 with batch_norm after each hidden linear, and the host
// platform it trains on (CPU memory, CBLAS). gpu_platform.hpp has its CUDA twin.
#include <cstdint>
#include <span>

#include "ddp/host/device.hpp"
#include "ddp/nn/batch_norm.hpp"
#include "ddp/nn/cross_entropy.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/relu.hpp"
#include "ddp/nn/sequential.hpp"

namespace fmnist {

using model = ddp::nn::sequential<ddp::nn::linear, ddp::nn::batch_norm, ddp::nn::relu, ddp::nn::linear,
                                  ddp::nn::batch_norm, ddp::nn::relu, ddp::nn::linear>;

// Every rank builds it from the same seed; the trainer broadcasts rank 0's weights anyway (P5, P6).
inline model make_model(std::uint64_t seed, std::size_t hidden = 512) {
  return model(ddp::nn::linear(784, hidden, seed), ddp::nn::batch_norm(hidden), ddp::nn::relu(),
               ddp::nn::linear(hidden, hidden, seed + 1), ddp::nn::batch_norm(hidden), ddp::nn::relu(),
               ddp::nn::linear(hidden, 10, seed + 2));
}

// Where a rank's model, batches and loss live. Host: nothing moves.
struct host_platform {
  static constexpr const char* name = "cpu";
  using device = ddp::host::device;
  using model = fmnist::model;
  template <class Launcher>
  using communicator = Launcher;

  static model make_model(device&, std::uint64_t seed) { return fmnist::make_model(seed); }
  static const ddp::nn::matrix& input(device&, const ddp::nn::matrix& x) { return x; }
  static ddp::nn::cross_entropy_result loss(device&, const ddp::nn::matrix& logits, std::span<const std::int32_t> labels,
                                            const ddp::sample_weights& weights) {
    return ddp::nn::softmax_cross_entropy(logits, labels, weights);
  }
  // Runs f(communicator&, device&) on this rank, given the launcher's communicator.
  template <class Launcher, class Config, class F>
  static void on_rank(Launcher& launcher, const Config&, F&& f) {
    device dev;
    f(launcher, dev);
  }
};

}  // namespace fmnist
