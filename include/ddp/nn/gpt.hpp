#pragma once
// A GPT, as nanoGPT's: token embedding (wte) plus learned position embedding (wpe), `layers`
// pre-LN transformer blocks (h.0, h.1, ...), a final layer norm (ln_f), and an output head tied
// to the token embedding: logits = ln_f(x) wteᵀ, no bias. A model of ddp's module concept,
// with a number of blocks chosen at run time.
//
//   ddp::nn::gpt model({.vocab = 256, .context = 64, .layers = 4, .heads = 4, .width = 128});
//   ddp::nn::token_batch batch{sequences, length, tokens};        // token t of sequence b at b*T + t
//   auto logits = model.forward(batch);                            // B*T rows x vocab
//   auto ce = ddp::nn::sequence_cross_entropy(logits, targets);    // targets: the next tokens
//   model.backward(ce.grad, ddp::ready_sink{});
//
// The tied weight is one parameter, listed once ("wte.weight"): its gradient is the head's
// contribution plus the embedding's, added in that order when the embedding's backward runs, so
// it is reported ready once, last. The head reads a copy of wte taken in the embedding's forward
// (vocab x width floats, kept from a training forward until its backward) and keeps its own part
// of the gradient (as many floats, during a backward) until then, so a trainer may hold wte only
// around the embedding (update::fully_sharded's layer hooks name parameters 0 and 1 there, then
// each block's, then ln_f's).
//
// Initialisation, as nanoGPT's, from config.seed on every rank: wte N(0, 0.02) from seed, wpe
// N(0, 0.02) from seed + 1, block k from seed + 2 + 4k (ddp/nn/transformer_block.hpp), its two
// c_proj weights scaled by 1/sqrt(2 * layers).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/concepts/module.hpp"
#include "ddp/core/error.hpp"
#include "ddp/nn/blas.hpp"
#include "ddp/nn/embedding.hpp"
#include "ddp/nn/layer_norm.hpp"
#include "ddp/nn/position_embedding.hpp"
#include "ddp/nn/sequence_cross_entropy.hpp"
#include "ddp/nn/transformer_block.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::nn {

struct gpt_config {
  std::size_t vocab = 256;    // byte tokens
  std::size_t context = 64;   // T, the longest sequence (position embedding rows)
  std::size_t layers = 4;
  std::size_t heads = 4;
  std::size_t width = 128;    // C; each block's MLP is 4C wide
  bool causal = true;         // the attention's mask (false only for tests and ablations)
  std::uint64_t seed = 1;     // every rank builds the same weights from it
};

// B sequences of T tokens each (T <= context), row-major: token t of sequence b at b*T + t.
struct token_batch {
  std::size_t sequences = 0, length = 0;
  std::vector<std::int32_t> tokens;
};

class gpt {
 public:
  using input_type = token_batch;
  using output_type = matrix;  // logits: B*T rows x vocab, row b*T + t
  static constexpr bool reports_gradient_ready = true;

  explicit gpt(const gpt_config& config);

  // nanoGPT's names: wte.weight, wpe.weight, h.0.ln_1.weight, ..., ln_f.weight, ln_f.bias.
  std::vector<parameter_ref> parameters();
  std::vector<buffer_ref> buffers() { return {}; }

  matrix forward(const token_batch& x);
  void backward(const matrix& grad_logits, const ready_sink& ready);

  // Training forwards save what backward needs; evaluation forwards save nothing.
  void train(bool on = true) noexcept { training_ = on; }
  void eval() noexcept { training_ = false; }
  bool training() const noexcept { return training_; }

  void bind_gradient(std::size_t index, float* storage) {
    with_parameter(index, [&](auto& p) { p.bind_gradient(storage); });
  }
  void bind_parameter(std::size_t index, float* storage) {
    with_parameter(index, [&](auto& p) { p.bind_value(storage); });
  }
  // Layer by layer (update::sharded_gradients, update::fully_sharded): the embeddings, each
  // block's attention half and MLP half, and ln_f are the layers the hooks hear of
  // (ddp/concepts/module.hpp).
  void set_layer_hooks(layer_hooks* hooks) noexcept { hooks_ = hooks; }
  void place_gradient(std::size_t index, float* storage) {
    with_parameter(index, [&](auto& p) { p.place_gradient(storage); });
  }
  void place_parameter(std::size_t index, float* storage) {
    with_parameter(index, [&](auto& p) { p.place_value(storage); });
  }

  const gpt_config& config() const noexcept { return config_; }
  std::size_t parameter_count() const noexcept { return parameter_count_; }  // elements

 private:
  // Parameter indices: 0 wte, 1 wpe, then each block's, then ln_f's two.
  std::size_t first_of_block(std::size_t k) const noexcept { return 2 + k * transformer_block::parameter_tensors; }
  std::size_t first_of_ln_f() const noexcept { return first_of_block(blocks_.size()); }
  template <class F>
  void with_parameter(std::size_t index, F&& f) {
    if (index == 0) return f(wte_.params()[0]);
    if (index == 1) return f(wpe_.params()[0]);
    const std::size_t per = transformer_block::parameter_tensors;
    if (index < first_of_ln_f()) {
      auto ps = blocks_[(index - 2) / per].params();
      return f(ps[(index - 2) % per]);
    }
    if (index < first_of_ln_f() + 2) return f(ln_f_.params()[index - first_of_ln_f()]);
    throw std::out_of_range("ddp::nn::gpt: no parameter " + std::to_string(index) + " (it has " +
                            std::to_string(first_of_ln_f() + 2) + ")");
  }
  // Runs `f` between the layer hooks' calls for parameters [first, first + count).
  template <class F>
  void hooked_forward(std::size_t first, std::size_t count, F&& f) {
    if (hooks_) hooks_->before_forward(first, count);
    f();
    if (hooks_) hooks_->after_forward(first, count);
  }
  template <class F>
  void hooked_backward(std::size_t first, std::size_t count, const ready_sink& ready, F&& f) {
    if (hooks_) hooks_->before_backward(first, count);
    f();
    if (hooks_) hooks_->after_backward(first, count);
    for (std::size_t i = first; i < first + count; ++i) ready(i);
  }
  void check_batch(const token_batch& x) const;
  static const gpt_config& checked(const gpt_config& config);

  // What a training forward keeps for its backward: ln_f's output and the wte the head read.
  struct saved_forward {
    matrix h;
    std::vector<float> head_weight;
  };

  gpt_config config_;
  embedding wte_;
  position_embedding wpe_;
  std::vector<transformer_block> blocks_;
  layer_norm ln_f_;
  std::size_t parameter_count_ = 0;
  std::vector<saved_forward> saved_;  // per training forward
  std::size_t pending_ = 0;
  layer_hooks* hooks_ = nullptr;
  bool training_ = true;
};

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE const gpt_config& gpt::checked(const gpt_config& config) {
  if (config.vocab == 0 || config.context == 0 || config.heads == 0 || config.width % config.heads != 0 ||
      config.width == 0)
    throw error("nn", "gpt", -1,
                "config: vocab " + std::to_string(config.vocab) + ", context " + std::to_string(config.context) +
                    ", width " + std::to_string(config.width) + ", heads " + std::to_string(config.heads) +
                    ": vocab and context must be positive and the width a positive multiple of the heads");
  return config;
}

DDP_RUNTIME_INLINE gpt::gpt(const gpt_config& config)
    : config_(checked(config)), wte_(config.vocab, config.width, config.seed), wpe_(config.context, config.width, config.seed + 1),
      ln_f_(config.width) {
  for (auto& v : wte_.params()[0].value()) v *= 0.02f;
  for (auto& v : wpe_.params()[0].value()) v *= 0.02f;
  const float projection_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(std::max<std::size_t>(config.layers, 1)));
  blocks_.reserve(config.layers);
  for (std::size_t k = 0; k < config.layers; ++k)
    blocks_.emplace_back(config.width, config.heads, config.seed + 2 + 4 * k, config.causal, projection_scale);
  for (const auto& p : parameters()) parameter_count_ += p.value.numel();
}

DDP_RUNTIME_INLINE std::vector<parameter_ref> gpt::parameters() {
  std::vector<parameter_ref> refs{wte_.params()[0].ref("wte."), wpe_.params()[0].ref("wpe.")};
  for (std::size_t k = 0; k < blocks_.size(); ++k)
    for (auto& p : blocks_[k].params()) refs.push_back(p.ref("h." + std::to_string(k) + "."));
  for (auto& p : ln_f_.params()) refs.push_back(p.ref("ln_f."));
  return refs;
}

DDP_RUNTIME_INLINE void gpt::check_batch(const token_batch& x) const {
  if (x.length == 0 || x.length > config_.context)
    throw error("nn", "gpt forward", -1,
                "sequences of " + std::to_string(x.length) + " tokens: the length must be in [1, " +
                    std::to_string(config_.context) + "] (the config's context)");
  if (x.tokens.size() % x.length != 0 || x.tokens.size() / x.length != x.sequences)
    throw error("nn", "gpt forward", -1,
                std::to_string(x.tokens.size()) + " tokens for " + std::to_string(x.sequences) + " sequences of " +
                    std::to_string(x.length) + "; a token_batch holds sequences * length tokens, token t of "
                    "sequence b at b * length + t");
}

DDP_RUNTIME_INLINE matrix gpt::forward(const token_batch& x) {
  check_batch(x);
  const std::size_t c = config_.width, v = config_.vocab, rows = x.tokens.size();
  matrix h;
  std::vector<float> head_weight;
  hooked_forward(0, 2, [&] {
    wte_.params()[0].before_forward();
    wpe_.params()[0].before_forward();
    const auto w = wte_.params()[0].value();
    head_weight.assign(w.begin(), w.end());
    wpe_.set_sequence_length(x.length);
    h = wpe_.forward(wte_.forward(x.tokens, training_), training_);
  });
  // Each block in its two halves (attention, MLP), each its own layer for the hooks: under
  // update::fully_sharded a half block's parameters are gathered at a time (and the next half's).
  constexpr std::size_t half = transformer_block::attention_tensors,
                        rest = transformer_block::parameter_tensors - half;
  for (std::size_t k = 0; k < blocks_.size(); ++k) {
    auto params = blocks_[k].params();
    hooked_forward(first_of_block(k), half, [&] {
      for (std::size_t i = 0; i < half; ++i) params[i].before_forward();
      blocks_[k].set_sequence_length(x.length);
      h = blocks_[k].forward_attention(h, training_);
    });
    hooked_forward(first_of_block(k) + half, rest, [&] {
      for (std::size_t i = half; i < half + rest; ++i) params[i].before_forward();
      h = blocks_[k].forward_mlp(h, training_);
    });
  }
  hooked_forward(first_of_ln_f(), 2, [&] {
    for (auto& p : ln_f_.params()) p.before_forward();
    h = ln_f_.forward(h, training_);
  });
  matrix logits(rows, v);
  blas::gemm(false, true, rows, v, c, 1.0f, h.data.data(), c, head_weight.data(), c, 0.0f, logits.data.data(), v);
  if (training_) {
    saved_.push_back({std::move(h), std::move(head_weight)});
    ++pending_;
  }
  return logits;
}

DDP_RUNTIME_INLINE void gpt::backward(const matrix& grad_logits, const ready_sink& ready) {
  if (pending_ == 0) throw std::logic_error("ddp::nn::gpt: backward without a training forward");
  const std::size_t c = config_.width, v = config_.vocab;
  require_cols(grad_logits, v, "gpt backward (the logits' gradient)");
  // Checked before anything is popped: a wrong gradient leaves the forward's state as it was.
  if (saved_.empty() || grad_logits.rows != saved_.back().h.rows)
    throw error("nn", "gpt backward", -1,
                std::to_string(grad_logits.rows) + " rows of gradient for a forward of " +
                    std::to_string(saved_.empty() ? 0 : saved_.back().h.rows) +
                    " positions; pass d loss / d logits of the last forward not yet backwarded");
  saved_forward saved = pop_saved(saved_, "gpt");
  matrix& h = saved.h;
  std::vector<float>& head_weight = saved.head_weight;
  --pending_;
  // The head: its part of wte's gradient waits in head_grad for the embedding's backward.
  std::vector<float> head_grad(v * c);
  blas::gemm(true, false, v, c, h.rows, 1.0f, grad_logits.data.data(), v, h.data.data(), c, 0.0f, head_grad.data(),
             c);
  matrix g(h.rows, c);
  blas::gemm(false, false, h.rows, c, v, 1.0f, grad_logits.data.data(), v, head_weight.data(), c, 0.0f,
             g.data.data(), c);
  h = {};
  head_weight = {};
  hooked_backward(first_of_ln_f(), 2, ready, [&] {
    g = ln_f_.backward(std::move(g), true);
    for (auto& p : ln_f_.params()) p.after_backward();
  });
  constexpr std::size_t half = transformer_block::attention_tensors,
                        rest = transformer_block::parameter_tensors - half;
  for (std::size_t k = blocks_.size(); k-- > 0;) {
    auto params = blocks_[k].params();
    hooked_backward(first_of_block(k) + half, rest, ready, [&] {
      g = blocks_[k].backward_mlp(g, true);
      for (std::size_t i = half; i < half + rest; ++i) params[i].after_backward();
    });
    hooked_backward(first_of_block(k), half, ready, [&] {
      g = blocks_[k].backward_attention(g, true);
      for (std::size_t i = 0; i < half; ++i) params[i].after_backward();
    });
  }
  hooked_backward(0, 2, ready, [&] {
    g = wpe_.backward(g, true);
    auto dw = wte_.params()[0].grad();
    for (std::size_t i = 0; i < dw.size(); ++i) dw[i] += head_grad[i];
    wte_.backward(g);
    wte_.params()[0].after_backward();
    wpe_.params()[0].after_backward();
  });
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::nn
