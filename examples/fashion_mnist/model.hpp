#pragma once
// The example's model: 784-512-512-10 with batch_norm after each hidden linear.
#include "ddp/nn/batch_norm.hpp"
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

}  // namespace fmnist
