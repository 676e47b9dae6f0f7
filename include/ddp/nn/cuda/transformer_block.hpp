#pragma once
// A pre-LN transformer block on a GPU: ddp::nn::transformer_block (x + attn(ln_1(x)), then
// x + mlp(ln_2(x))) of the CUDA layers, with its parameter names, order and initialisation (the
// same seed gives the same weights).
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/nn/cuda/attention.hpp"
#include "ddp/nn/cuda/gelu.hpp"
#include "ddp/nn/cuda/layer_norm.hpp"
#include "ddp/nn/cuda/linear.hpp"
#include "ddp/nn/cuda/residual.hpp"
#include "ddp/nn/residual.hpp"
#include "ddp/nn/transformer_block.hpp"

namespace ddp::nn::cuda {

class transformer_block {
 public:
  using matrix_type = matrix;
  static constexpr std::size_t parameter_tensors = ddp::nn::transformer_block::parameter_tensors;

  transformer_block(ddp::cuda::device& dev, std::size_t width, std::size_t heads, std::uint64_t seed,
                    bool causal = true, float projection_scale = 1.0f)
      : attn_(layer_norm(dev, width), attention(dev, width, heads, seed, causal, projection_scale)),
        mlp_(layer_norm(dev, width), linear(dev, width, 4 * width, seed + 2), gelu(),
             linear(dev, 4 * width, width, seed + 3)) {
    detail::initialise_gpt_linear(dev, mlp_.layer<1>(), 0.02f, seed + 2);
    detail::initialise_gpt_linear(dev, mlp_.layer<3>(), 0.02f * projection_scale, seed + 3);
  }

  void set_sequence_length(std::size_t length) noexcept { attn_.layer<1>().set_sequence_length(length); }

  matrix forward(const matrix& x, bool training) { return mlp_.forward(attn_.forward(x, training), training); }
  matrix backward(const matrix& dy, bool need_dx) { return attn_.backward(mlp_.backward(dy, true), need_dx); }

  // ln_1.*, attn.c_attn.*, attn.c_proj.*, ln_2.*, mlp.c_fc.*, mlp.c_proj.*: the host block's.
  std::vector<nested_parameter<parameter>> params() {
    std::vector<nested_parameter<parameter>> out;
    out.reserve(parameter_tensors);
    for (auto& p : attn_.layer<0>().params()) out.emplace_back(p, "ln_1.");
    for (auto& p : attn_.layer<1>().params()) out.push_back(ddp::nn::detail::nest(p, "attn."));
    for (auto& p : mlp_.layer<0>().params()) out.emplace_back(p, "ln_2.");
    for (auto& p : mlp_.layer<1>().params()) out.emplace_back(p, "mlp.c_fc.");
    for (auto& p : mlp_.layer<3>().params()) out.emplace_back(p, "mlp.c_proj.");
    return out;
  }
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }

  attention& attn() noexcept { return attn_.layer<1>(); }

 private:
  residual<layer_norm, attention> attn_;
  residual<layer_norm, linear, gelu, linear> mlp_;
};

}  // namespace ddp::nn::cuda
