// ddp::runtime: the compiled runtime (DDP_COMPILED_RUNTIME=1 through the target); a layer and a
// cross-entropy whose code is in libddp_runtime.a, not in this file.
#include <ddp/nn/cross_entropy.hpp>
#include <ddp/nn/linear.hpp>

#include <cstdint>
#include <string>
#include <vector>

#if !DDP_COMPILED_RUNTIME
#error "ddp::runtime did not set DDP_COMPILED_RUNTIME"
#endif

std::string uses_runtime() {
  ddp::nn::linear layer(4, 3, /*seed=*/1);
  const auto logits = layer.forward(ddp::nn::matrix(2, 4, 0.5f), /*training=*/false);
  const std::vector<std::int32_t> labels{0, 2};
  const auto ce = ddp::nn::softmax_cross_entropy(logits, labels);
  if (!(ce.loss > 0)) return "the compiled layer and loss gave a loss of " + std::to_string(ce.loss);
  return "ok: ddp::runtime's linear and cross-entropy (compiled), loss " + std::to_string(ce.loss);
}
