#pragma once
// ddp-bench's GPT (--model gpt, --model gpt-10m): ddp::nn::gpt at the char_gpt example's size or at
// nanoGPT's shakespeare_char size, and batches of byte tokens for it. The tokens are drawn from a
// seed, not read from the corpus: a step costs the same whatever the bytes are.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/core/random.hpp"
#include "ddp/nn/gpt.hpp"

namespace bench {

// The models --model names, beside the MLP.
inline bool is_gpt_model(const std::string& name) { return name == "gpt" || name == "gpt-10m"; }

inline ddp::nn::gpt_config gpt_shape(const std::string& name) {
  if (name == "gpt") return {.vocab = 256, .context = 64, .layers = 4, .heads = 4, .width = 128};
  if (name == "gpt-10m") return {.vocab = 256, .context = 256, .layers = 6, .heads = 6, .width = 384};
  throw std::invalid_argument("--model " + name + ": the GPT sizes are gpt (4 layers, 4 heads, width 128, context 64) "
                              "and gpt-10m (6 layers, 6 heads, width 384, context 256)");
}

inline std::string describe_gpt(const ddp::nn::gpt_config& c, std::size_t parameters) {
  return "GPT " + std::to_string(c.layers) + " layers, " + std::to_string(c.heads) + " heads, width " +
         std::to_string(c.width) + ", context " + std::to_string(c.context) + ", byte vocabulary (" +
         std::to_string(parameters) + " parameters)";
}

// B sequences of the model's full context and their next tokens.
struct token_batch {
  ddp::nn::token_batch x;
  std::vector<std::int32_t> y;
};

inline token_batch make_token_batch(const ddp::nn::gpt_config& c, std::size_t sequences, std::uint64_t seed) {
  ddp::splitmix64 rng(seed);
  token_batch b{{.sequences = sequences, .length = c.context, .tokens = std::vector<std::int32_t>(sequences * c.context)},
                std::vector<std::int32_t>(sequences * c.context)};
  for (auto& t : b.x.tokens) t = static_cast<std::int32_t>(rng.below(c.vocab));
  for (auto& t : b.y) t = static_cast<std::int32_t>(rng.below(c.vocab));
  return b;
}

}  // namespace bench
