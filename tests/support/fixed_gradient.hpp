#pragma once
// A module for PowerSGD's tests: one parameter whose gradient never changes. Rank r's is a fixed
// random 24 x 16 matrix (full rank), and a vector beside it (r + 1 in every element). With SGD
// at lr 1 the parameters are minus the sum of the averaged gradients the trainer applied.
#include <cmath>
#include <span>
#include <vector>

#include "ddp/core/random.hpp"
#include "ddp/core/ready_sink.hpp"
#include "ddp/core/tensor.hpp"

namespace test {

struct fixed_gradient {
  using input_type = int;
  using output_type = int;
  static constexpr bool reports_gradient_ready = true;
  static constexpr std::size_t rows = 24, cols = 16;
  std::vector<float> w = std::vector<float>(rows * cols, 0.0f), w_grad = w, mine = w;
  std::vector<float> b = std::vector<float>(cols, 0.0f), b_grad = b;
  float b_mine = 0;
  explicit fixed_gradient(int rank) : b_mine(static_cast<float>(rank + 1)) {
    ddp::splitmix64 g(77 + static_cast<std::uint64_t>(rank));
    for (auto& v : mine) v = g.uniform(-1.0f, 1.0f);
  }
  std::vector<ddp::parameter_ref> parameters() {
    return {{"w", ddp::make_tensor_ref(std::span<float>(w), {rows, cols}), ddp::make_tensor_ref(std::span<float>(w_grad), {rows, cols})},
            {"b", ddp::make_tensor_ref(std::span<float>(b), {cols}), ddp::make_tensor_ref(std::span<float>(b_grad), {cols})}};
  }
  std::vector<ddp::buffer_ref> buffers() { return {}; }
  int forward(int x) { return x; }
  void backward(int, const ddp::ready_sink& ready) {
    for (std::size_t i = 0; i < w_grad.size(); ++i) w_grad[i] += mine[i];
    for (auto& g : b_grad) g += b_mine;
    ready(1);
    ready(0);
  }

  // How far `applied` (the matrix's mean update per step) is from the average of the world's
  // gradients, relative, in the Frobenius norm.
  static double error_against_average(const std::vector<float>& applied, int world) {
    std::vector<double> average(rows * cols, 0.0);
    for (int r = 0; r < world; ++r) {
      const fixed_gradient m(r);
      for (std::size_t i = 0; i < average.size(); ++i) average[i] += m.mine[i] / world;
    }
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < average.size(); ++i) {
      diff += std::pow(applied[i] - average[i], 2);
      norm += average[i] * average[i];
    }
    return std::sqrt(diff / norm);
  }
};

}  // namespace test
