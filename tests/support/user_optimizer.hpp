#pragma once
// An optimizer written the way a user writes one, outside the library: free of range-v3, so an
// nvcc translation unit can include it (tests/cuda/user_optimizer.cu instantiates its kernel).
// docs/policies.md shows it between the `// [doc: ...]` marks (the #include there is a no-op).
#include <cstdint>
#include <string>
#include <string_view>

#include <ddp/core/host_device.hpp>
#include <ddp/optim/optimizer.hpp>

namespace user {

// [doc: policies.md]
#include <ddp/optim/optimizer.hpp>  // ddp::optim::slot and DDP_HOST_DEVICE

// Optimizer: Lion (Chen et al. 2023), which ddp does not ship. One rule for host and CUDA.
struct lion {
  using slot = ddp::optim::slot;
  static constexpr std::string_view name = "lion";
  static constexpr int state_slots = 1;  // the momentum
  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.99f, weight_decay = 0.0f;
  struct rule {
    float lr, beta1, beta2, weight_decay;
    DDP_HOST_DEVICE void operator()(float& p, float g, float* s) const {
      const float c = beta1 * s[0] + (1.0f - beta1) * g;
      const float sign = static_cast<float>((c > 0.0f) - (c < 0.0f));
      p = p * (1.0f - lr * weight_decay) - lr * sign;
      s[0] = beta2 * s[0] + (1.0f - beta2) * g;
    }
  };
  rule at(std::int64_t) const { return {lr, beta1, beta2, weight_decay}; }
  std::string describe() const { return "lion(lr=" + std::to_string(lr) + ")"; }
};
// [end doc]

}  // namespace user
