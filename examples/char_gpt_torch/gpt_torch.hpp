#pragma once
// The character-level GPT of examples/char_gpt written in libtorch: token embedding (the output
// head tied to it), learned position embedding, `layers` pre-LN blocks (x + attn(ln_1(x)), then
// x + mlp(ln_2(x)); causal self-attention through one fused QKV linear and an output linear, the
// MLP 4C wide with exact GELU), a final LayerNorm. Parameter names are nanoGPT's ("wte.weight",
// "h.0.attn.c_attn.weight", ..., "ln_f.bias"), and so is the initialisation: every linear and
// embedding weight N(0, 0.02), the output projections of each block N(0, 0.02 / sqrt(2 layers)),
// biases zero, LayerNorm weight one and bias zero.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace char_gpt_torch {

struct gpt_shape {
  std::int64_t vocab = 256;  // byte tokens
  std::int64_t context = 64;
  std::int64_t layers = 4;
  std::int64_t heads = 4;
  std::int64_t width = 128;
  bool causal = true;
};

struct attentionImpl : torch::nn::Module {
  attentionImpl(const gpt_shape& s)
      : heads(s.heads), causal(s.causal),
        c_attn(register_module("c_attn", torch::nn::Linear(s.width, 3 * s.width))),
        c_proj(register_module("c_proj", torch::nn::Linear(s.width, s.width))),
        // Above the diagonal: a later position, hidden from the query. Not a buffer: nothing to sync.
        future(torch::ones({s.context, s.context}, torch::kBool).triu(1)) {}

  torch::Tensor forward(const torch::Tensor& x) {  // B x T x C
    const auto b = x.size(0), t = x.size(1), c = x.size(2), d = c / heads;
    const auto qkv = c_attn(x).split(c, 2);
    const auto q = qkv[0].view({b, t, heads, d}).transpose(1, 2);  // B x H x T x d
    const auto k = qkv[1].view({b, t, heads, d}).transpose(1, 2);
    const auto v = qkv[2].view({b, t, heads, d}).transpose(1, 2);
    auto scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(d)));
    if (causal)
      scores = scores.masked_fill(future.slice(0, 0, t).slice(1, 0, t), -std::numeric_limits<float>::infinity());
    const auto p = torch::softmax(scores, -1, torch::kFloat);  // in f32
    return c_proj(torch::matmul(p, v).transpose(1, 2).contiguous().view({b, t, c}));
  }

  std::int64_t heads;
  bool causal;
  torch::nn::Linear c_attn, c_proj;
  torch::Tensor future;
};
TORCH_MODULE(attention);

struct mlpImpl : torch::nn::Module {
  explicit mlpImpl(std::int64_t width)
      : c_fc(register_module("c_fc", torch::nn::Linear(width, 4 * width))),
        c_proj(register_module("c_proj", torch::nn::Linear(4 * width, width))) {}
  torch::Tensor forward(const torch::Tensor& x) { return c_proj(torch::gelu(c_fc(x))); }
  torch::nn::Linear c_fc, c_proj;
};
TORCH_MODULE(mlp);

struct blockImpl : torch::nn::Module {
  explicit blockImpl(const gpt_shape& s)
      : ln_1(register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.width})))),
        attn(register_module("attn", attention(s))),
        ln_2(register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.width})))),
        mlp_(register_module("mlp", mlp(s.width))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln_1(x));
    return x + mlp_(ln_2(x));
  }
  torch::nn::LayerNorm ln_1;
  attention attn;
  torch::nn::LayerNorm ln_2;
  mlp mlp_;
};
TORCH_MODULE(block);

struct gptImpl : torch::nn::Module {
  explicit gptImpl(const gpt_shape& s)
      : shape(s),
        wte(register_module("wte", torch::nn::Embedding(s.vocab, s.width))),
        wpe(register_module("wpe", torch::nn::Embedding(s.context, s.width))),
        h(register_module("h", torch::nn::ModuleList())),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.width})))) {
    for (std::int64_t i = 0; i < s.layers; ++i) h->push_back(block(s));
    torch::NoGradGuard no_grad;
    for (auto& item : named_parameters()) {
      const auto& name = item.key();
      auto& p = item.value();
      if (name.ends_with(".bias")) p.zero_();
      else if (name.starts_with("ln_") || name.find(".ln_") != std::string::npos) p.fill_(1.0);
      else if (name.ends_with("c_proj.weight")) p.normal_(0.0, 0.02 / std::sqrt(2.0 * static_cast<double>(s.layers)));
      else p.normal_(0.0, 0.02);
    }
  }

  // tokens: B x T (int64). Returns the logits, (B*T) x vocab, row b*T + t.
  torch::Tensor forward(const torch::Tensor& tokens) {
    const auto b = tokens.size(0), t = tokens.size(1);
    auto x = wte(tokens) + wpe(torch::arange(t, torch::kLong));
    for (const auto& layer : *h) x = layer->as<blockImpl>()->forward(x);
    x = ln_f(x);
    return torch::matmul(x, wte->weight.t()).view({b * t, shape.vocab});  // the head tied to wte
  }

  gpt_shape shape;
  torch::nn::Embedding wte, wpe;
  torch::nn::ModuleList h;
  torch::nn::LayerNorm ln_f;
};
TORCH_MODULE(gpt);

}  // namespace char_gpt_torch
