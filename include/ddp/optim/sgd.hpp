#pragma once
// SGD with momentum, Nesterov and (coupled) weight decay, with PyTorch's update rule:
//   g = grad + weight_decay * p;  m = momentum * m + g;  g = nesterov ? g + momentum * m : m;
//   p -= lr * g
#include <string>

namespace ddp::optim {

struct slot;

struct sgd {
  using slot = optim::slot;
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;

  // Per-element state slots a bucket keeps for this optimizer.
  static constexpr int state_slots = 1;
  static constexpr const char* name = "sgd";

  std::string describe() const {
    return "sgd(lr=" + std::to_string(lr) + ", momentum=" + std::to_string(momentum) +
           ", weight_decay=" + std::to_string(weight_decay) +
           (nesterov ? ", nesterov)" : ")");
  }
};

}  // namespace ddp::optim
