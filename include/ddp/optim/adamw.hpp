#pragma once
// AdamW (decoupled weight decay), PyTorch's rule at step t (1-based, counted per parameter):
//   p *= 1 - lr * weight_decay;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "ddp/core/host_device.hpp"

namespace ddp::optim {

struct slot;

struct adamw {
  using slot = optim::slot;
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;

  static constexpr int state_slots = 2;  // m, v
  static constexpr std::string_view name = "adamw";

  // The step-dependent factors are computed once per call, on the host.
  struct rule {
    float beta1, beta2, eps, decay, step_size, inv_sqrt_bc2;
    DDP_HOST_DEVICE void operator()(float& p, float g, float* state) const {
      float& m = state[0];
      float& v = state[1];
      p *= decay;
      m = beta1 * m + (1.0f - beta1) * g;
      v = beta2 * v + (1.0f - beta2) * g * g;
      p -= step_size * m / (sqrtf(v) * inv_sqrt_bc2 + eps);
    }
    bool operator==(const rule&) const = default;
  };
  rule at(std::int64_t step) const {
    const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
    const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
    return {beta1, beta2, eps, 1.0f - lr * weight_decay, lr / bc1, 1.0f / std::sqrt(bc2)};
  }

  bool operator==(const adamw&) const = default;

  std::string describe() const {
    return "adamw(lr=" + std::to_string(lr) + ", betas=(" + std::to_string(beta1) + ", " +
           std::to_string(beta2) + "), eps=" + std::to_string(eps) +
           ", weight_decay=" + std::to_string(weight_decay) + ")";
  }
};

}  // namespace ddp::optim
