#pragma once
// SGD with momentum, Nesterov and (coupled) weight decay, with PyTorch's update rule:
//   g = grad + weight_decay * p;  m = momentum * m + g;  g = nesterov ? g + momentum * m : m;
//   p -= lr * g
// Momentum 0 leaves the state alone.
#include <cstdint>
#include <string>
#include <string_view>

#include "ddp/core/host_device.hpp"

namespace ddp::optim {

struct slot;

struct sgd {
  using slot = optim::slot;
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;

  static constexpr int state_slots = 1;  // momentum
  static constexpr std::string_view name = "sgd";

  struct rule {
    float lr, momentum, weight_decay;
    bool nesterov;
    DDP_HOST_DEVICE void operator()(float& p, float g, float* state) const {
      const float d = g + weight_decay * p;
      if (momentum == 0.0f) {
        p -= lr * d;
        return;
      }
      float& m = state[0];
      m = momentum * m + d;
      p -= lr * (nesterov ? d + momentum * m : m);
    }
    bool operator==(const rule&) const = default;
  };
  rule at(std::int64_t) const { return {lr, momentum, weight_decay, nesterov}; }

  bool operator==(const sgd&) const = default;

  std::string describe() const {
    return "sgd(lr=" + std::to_string(lr) + ", momentum=" + std::to_string(momentum) +
           ", weight_decay=" + std::to_string(weight_decay) +
           (nesterov ? ", nesterov)" : ")");
  }
};

}  // namespace ddp::optim
