#pragma once
// AdamW (decoupled weight decay), PyTorch's rule at step t (1-based):
//   p *= 1 - lr * weight_decay;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
#include <string>

namespace ddp::optim {

struct slot;

struct adamw {
  using slot = optim::slot;
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;

  static constexpr int state_slots = 2;
  static constexpr const char* name = "adamw";

  std::string describe() const {
    return "adamw(lr=" + std::to_string(lr) + ", betas=(" + std::to_string(beta1) + ", " +
           std::to_string(beta2) + "), eps=" + std::to_string(eps) +
           ", weight_decay=" + std::to_string(weight_decay) + ")";
  }
};

}  // namespace ddp::optim
