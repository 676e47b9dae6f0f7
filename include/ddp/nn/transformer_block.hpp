#pragma once
// A pre-LN transformer block, as nanoGPT's Block: x + attn(ln_1(x)), then x + mlp(ln_2(x)) with
// mlp = c_fc (C -> 4C), GELU, c_proj (4C -> C). Built from ddp::nn::residual, layer_norm,
// attention, linear and gelu; a layer of a sequential like any other (its rows: B sequences of
// T positions, T told with set_sequence_length).
//
// Parameters in nanoGPT's order and names: ln_1.weight, ln_1.bias, attn.c_attn.weight,
// attn.c_attn.bias, attn.c_proj.weight, attn.c_proj.bias, ln_2.weight, ln_2.bias,
// mlp.c_fc.weight, mlp.c_fc.bias, mlp.c_proj.weight, mlp.c_proj.bias. Linear weights start
// N(0, 0.02) (both c_proj scaled by projection_scale), biases 0, layer norms at 1 and 0; from
// `seed`: the attention's from seed and seed + 1, c_fc's from seed + 2, mlp.c_proj's from seed + 3.
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/nn/attention.hpp"
#include "ddp/nn/gelu.hpp"
#include "ddp/nn/layer_norm.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/residual.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::nn {

class transformer_block {
 public:
  using matrix_type = matrix;
  static constexpr std::size_t parameter_tensors = 12;

  transformer_block(std::size_t width, std::size_t heads, std::uint64_t seed, bool causal = true,
                    float projection_scale = 1.0f);

  void set_sequence_length(std::size_t length) noexcept { attn_.layer<1>().set_sequence_length(length); }

  matrix forward(const matrix& x, bool training) { return mlp_.forward(attn_.forward(x, training), training); }
  matrix backward(const matrix& dy, bool need_dx) { return attn_.backward(mlp_.backward(dy, true), need_dx); }

  // The two halves on their own: x + attn(ln_1(x)), whose parameters are the first
  // attention_tensors of params(), and x + mlp(ln_2(x)), the rest (ddp::nn::gpt gathers and
  // releases them one at a time under update::fully_sharded).
  static constexpr std::size_t attention_tensors = 6;
  matrix forward_attention(const matrix& x, bool training) { return attn_.forward(x, training); }
  matrix forward_mlp(const matrix& x, bool training) { return mlp_.forward(x, training); }
  matrix backward_mlp(const matrix& dy, bool need_dx) { return mlp_.backward(dy, need_dx); }
  matrix backward_attention(const matrix& dy, bool need_dx) { return attn_.backward(dy, need_dx); }

  std::vector<nested_parameter<parameter>> params();
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }

  attention& attn() noexcept { return attn_.layer<1>(); }

 private:
  residual<layer_norm, attention> attn_;
  residual<layer_norm, linear, gelu, linear> mlp_;
};

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE transformer_block::transformer_block(std::size_t width, std::size_t heads, std::uint64_t seed,
                                                        bool causal, float projection_scale)
    : attn_(layer_norm(width), attention(width, heads, seed, causal, projection_scale)),
      mlp_(layer_norm(width), linear(width, 4 * width, seed + 2), gelu(), linear(4 * width, width, seed + 3)) {
  initialise_normal(mlp_.layer<1>().params()[0].value(), 0.02f, seed + 2);
  initialise_normal(mlp_.layer<3>().params()[0].value(), 0.02f * projection_scale, seed + 3);
  for (auto* l : {&mlp_.layer<1>(), &mlp_.layer<3>()})
    std::fill(l->params()[1].value().begin(), l->params()[1].value().end(), 0.0f);
}

DDP_RUNTIME_INLINE std::vector<nested_parameter<parameter>> transformer_block::params() {
  std::vector<nested_parameter<parameter>> out;
  out.reserve(parameter_tensors);
  for (auto& p : attn_.layer<0>().params()) out.emplace_back(p, "ln_1.");
  for (auto& p : attn_.layer<1>().params()) out.push_back(detail::nest(p, "attn."));
  for (auto& p : mlp_.layer<0>().params()) out.emplace_back(p, "ln_2.");
  for (auto& p : mlp_.layer<1>().params()) out.emplace_back(p, "mlp.c_fc.");
  for (auto& p : mlp_.layer<3>().params()) out.emplace_back(p, "mlp.c_proj.");
  return out;
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::nn
