#pragma once
// A module for tests of what the trainer does to gradients themselves: one parameter of 64
// floats whose gradient is the input (forward(v) remembers v; backward adds v to every element).
#include <span>
#include <vector>

#include "ddp/core/ready_sink.hpp"
#include "ddp/core/tensor.hpp"

namespace test {

struct constant_gradient {
  using input_type = float;
  using output_type = float;
  static constexpr bool reports_gradient_ready = true;
  std::vector<float> value = std::vector<float>(64, 0.0f), grad = std::vector<float>(64, 0.0f);
  float pending = 0;
  std::vector<ddp::parameter_ref> parameters() {
    return {{"w", ddp::make_tensor_ref(std::span<float>(value), {64}), ddp::make_tensor_ref(std::span<float>(grad), {64})}};
  }
  std::vector<ddp::buffer_ref> buffers() { return {}; }
  float forward(float v) { return pending = v; }
  void backward(float, const ddp::ready_sink& ready) {
    for (auto& g : grad) g += pending;
    ready(0);
  }
};

}  // namespace test
