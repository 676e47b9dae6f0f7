// The transformer's layers against finite differences of their forwards (ddp::nn::check_gradients):
// attention (causal and not, within one block of rows and past it), position embedding, the
// pre-LN block and the whole GPT; the mask (no gradient reaches a position from the outputs
// before it); the tied head (wte's gradient is
// the head's part plus the embedding's); the sequence cross-entropy's weights.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nn/gradient_checks.hpp"
#include "ddp/core/random.hpp"
#include "ddp/nn/attention.hpp"
#include "ddp/nn/check_gradients.hpp"
#include "ddp/nn/gpt.hpp"
#include "ddp/nn/position_embedding.hpp"
#include "ddp/nn/sequence_cross_entropy.hpp"
#include "ddp/nn/transformer_block.hpp"

// [doc: nn.md]
#include <ddp/nn/gpt.hpp>
#include <ddp/nn/sequence_cross_entropy.hpp>

// A character-level GPT in nanoGPT's shape for a CPU, one forward and backward on a text of
// bytes: each sequence's targets are its tokens moved on by one.
inline double gpt_loss(const std::vector<std::int32_t>& text) {
  ddp::nn::gpt model({.vocab = 256, .context = 64, .layers = 4, .heads = 4, .width = 128, .seed = 1});
  const std::size_t length = 64, sequences = (text.size() - 1) / length;
  ddp::nn::token_batch batch{sequences, length, {}};
  std::vector<std::int32_t> targets;
  for (std::size_t i = 0; i < sequences * length; ++i) {
    batch.tokens.push_back(text[i]);
    targets.push_back(text[i + 1]);
  }
  const auto ce = ddp::nn::sequence_cross_entropy(model.forward(batch), targets);
  model.backward(ce.grad, ddp::ready_sink{});
  return ce.loss;
}
// [end doc]

namespace transformer_test {

namespace {

using nn_test::random_matrix;

using nn_test::require_gradients;

// nanoGPT's N(0, 0.02) makes every gradient of a tiny model smaller than the check's tolerance:
// weights and biases drawn larger, so that each element's gradient is worth checking.
template <class Params>
void draw_large(Params&& params, std::uint64_t seed, float scale = 0.5f) {
  ddp::splitmix64 rng(seed);
  for (auto& p : params) {
    const auto ref = p.ref("");
    if (ref.name.find("ln_") != std::string::npos) continue;
    for (auto& v : ref.value.template as<float>()) v = rng.uniform(-scale, scale);
  }
}

ddp::nn::token_batch random_tokens(std::size_t sequences, std::size_t length, std::size_t vocab, std::uint64_t seed) {
  ddp::splitmix64 rng(seed);
  ddp::nn::token_batch b{sequences, length, std::vector<std::int32_t>(sequences * length)};
  for (auto& t : b.tokens) t = static_cast<std::int32_t>(rng.below(vocab));
  return b;
}

// d loss / d x of a layer for a dy that is zero past position `last` of every sequence.
template <class L>
ddp::nn::matrix input_gradient_up_to(L& layer, const ddp::nn::matrix& x, std::size_t length, std::size_t last) {
  (void)layer.forward(x, true);
  auto dy = random_matrix(x.rows, x.cols, 9);
  for (std::size_t r = 0; r < dy.rows; ++r)
    if (r % length > last)
      for (std::size_t c = 0; c < dy.cols; ++c) dy(r, c) = 0.0f;
  return layer.backward(dy, true);
}

bool rows_zero(const ddp::nn::matrix& m, std::size_t length, std::size_t after) {
  for (std::size_t r = 0; r < m.rows; ++r)
    for (std::size_t c = 0; c < m.cols; ++c)
      if (r % length > after && m(r, c) != 0.0f) return false;
  return true;
}
bool rows_nonzero(const ddp::nn::matrix& m, std::size_t length, std::size_t upto) {
  for (std::size_t r = 0; r < m.rows; ++r) {
    if (r % length > upto) continue;
    bool any = false;
    for (std::size_t c = 0; c < m.cols; ++c) any = any || m(r, c) != 0.0f;
    if (!any) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("attention backward matches finite differences, causal and not") {
  for (const bool causal : {true, false}) {
    CAPTURE(causal);
    ddp::nn::attention a(8, 2, 3, causal);
    draw_large(a.params(), 4);
    a.set_sequence_length(3);
    require_gradients(a, random_matrix(6, 8, 5));
  }
}

TEST_CASE("attention is causal: no gradient reaches a position from the outputs before it, and a later input "
          "leaves earlier outputs unchanged") {
  constexpr std::size_t t = 4, last = 1;
  const auto x = random_matrix(2 * t, 8, 6);
  ddp::nn::attention causal(8, 2, 3, true), open(8, 2, 3, false);
  for (auto* a : {&causal, &open}) {
    draw_large(a->params(), 4);
    a->set_sequence_length(t);
  }
  const auto dx = input_gradient_up_to(causal, x, t, last);
  CHECK(rows_zero(dx, t, last));  // exactly 0.0f
  CHECK(rows_nonzero(dx, t, last));
  const auto dx_open = input_gradient_up_to(open, x, t, last);
  CHECK_FALSE(rows_zero(dx_open, t, last));

  auto later = x;
  for (std::size_t c = 0; c < 8; ++c) later(t - 1, c) += 1.0f;  // the last position of sequence 0
  const auto y = causal.forward(x, false), y_later = causal.forward(later, false);
  for (std::size_t r = 0; r < t - 1; ++r)
    for (std::size_t c = 0; c < 8; ++c) CHECK(y(r, c) == y_later(r, c));
  CHECK(y(t - 1, 0) != y_later(t - 1, 0));
  const auto o = open.forward(x, false), o_later = open.forward(later, false);
  CHECK(o(0, 0) != o_later(0, 0));
}

TEST_CASE("causal attention past one block of rows (70 positions: blocks of 32, 32 and 6) matches finite "
          "differences and keeps the mask") {
  constexpr std::size_t t = 70, last = 40;
  ddp::nn::attention a(4, 2, 3, true);
  draw_large(a.params(), 4);
  a.set_sequence_length(t);
  const auto x = random_matrix(t, 4, 5);
  require_gradients(a, x);
  const auto dx = input_gradient_up_to(a, x, t, last);
  CHECK(rows_zero(dx, t, last));  // exactly 0.0f, in the blocks after the one of `last` and within it
  CHECK(rows_nonzero(dx, t, last));
}

TEST_CASE("attention names its parameters as nanoGPT, starts N(0, 0.02), and names a wrong sequence length") {
  ddp::nn::attention a(8, 2, 3);
  std::vector<std::string> names;
  for (auto& p : a.params()) names.push_back(p.ref("attn.").name);
  CHECK(names == std::vector<std::string>{"attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                                          "attn.c_proj.bias"});
  double sq = 0;
  for (float v : a.c_attn().params()[0].value()) sq += static_cast<double>(v) * v;
  CHECK(std::sqrt(sq / (3 * 8 * 8)) == doctest::Approx(0.02).epsilon(0.25));
  for (float v : a.c_attn().params()[1].value()) CHECK(v == 0.0f);
  CHECK_THROWS_WITH(a.forward(random_matrix(6, 8, 1), false), doctest::Contains("call set_sequence_length(T)"));
  a.set_sequence_length(4);
  CHECK_THROWS_WITH(a.forward(random_matrix(6, 8, 1), false),
                    doctest::Contains("6 rows are not whole sequences of 4 positions"));
  CHECK_THROWS_WITH(ddp::nn::attention(10, 4, 1), doctest::Contains("a positive multiple of the number of heads"));
}

TEST_CASE("position embedding backward matches finite differences, and names a sequence past its table") {
  ddp::nn::position_embedding p(5, 3, 2);
  p.set_sequence_length(4);
  require_gradients(p, random_matrix(8, 3, 3));
  p.set_sequence_length(6);
  CHECK_THROWS_WITH(p.forward(random_matrix(6, 3, 1), false), doctest::Contains("with T in [1, 5]"));
}

TEST_CASE("the pre-LN transformer block backward matches finite differences, and keeps the mask") {
  ddp::nn::transformer_block block(8, 2, 7);
  draw_large(block.params(), 8);
  block.set_sequence_length(3);
  require_gradients(block, random_matrix(6, 8, 9));
  std::vector<std::string> names;
  for (auto& p : block.params()) names.push_back(p.ref("").name);
  CHECK(names == std::vector<std::string>{"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                                          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                          "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"});
  block.set_sequence_length(4);
  const auto dx = input_gradient_up_to(block, random_matrix(8, 8, 10), 4, 2);
  CHECK(rows_zero(dx, 4, 2));
  CHECK(rows_nonzero(dx, 4, 2));
}

TEST_CASE("the GPT backward matches finite differences") {
  ddp::nn::gpt model({.vocab = 7, .context = 4, .layers = 2, .heads = 2, .width = 8, .seed = 3});
  for (auto& p : model.parameters()) {
    if (p.name.find("ln_") != std::string::npos) continue;
    ddp::splitmix64 rng(std::hash<std::string>{}(p.name));
    for (auto& v : p.value.as<float>()) v = rng.uniform(-0.5f, 0.5f);
  }
  require_gradients(model, random_tokens(2, 4, 7, 11));
}

TEST_CASE("the GPT is causal: a later token changes no earlier logit, and no position's embedding gets a gradient "
          "from the logits before it") {
  for (const bool causal : {true, false}) {
    CAPTURE(causal);
    ddp::nn::gpt model({.vocab = 9, .context = 6, .layers = 2, .heads = 2, .width = 8, .causal = causal, .seed = 4});
    auto x = random_tokens(2, 6, 9, 12);
    const auto logits = model.forward(x);
    auto g = random_matrix(logits.rows, logits.cols, 13);
    for (std::size_t r = 0; r < g.rows; ++r)
      if (r % 6 > 2)
        for (std::size_t c = 0; c < g.cols; ++c) g(r, c) = 0.0f;
    model.backward(g, ddp::ready_sink{});
    const auto wpe = model.parameters()[1];
    ddp::nn::matrix dpos(6, 8);
    const auto grad = wpe.grad.as<float>();
    std::copy(grad.begin(), grad.end(), dpos.data.begin());
    CHECK(rows_zero(dpos, 6, 2) == causal);
    CHECK(rows_nonzero(dpos, 6, 2));

    model.eval();
    x.tokens[5] = (x.tokens[5] + 1) % 9;  // sequence 0's last token
    const auto changed = model.forward(x);
    bool earlier_same = true;
    for (std::size_t r = 0; r < 5; ++r)
      for (std::size_t c = 0; c < 9; ++c) earlier_same = earlier_same && logits(r, c) == changed(r, c);
    CHECK(earlier_same == causal);
  }
}

TEST_CASE("the tied head: wte's gradient is the head's part plus the embedding's, each computed on its own") {
  const ddp::nn::gpt_config config{.vocab = 6, .context = 4, .layers = 1, .heads = 2, .width = 8, .seed = 6};
  ddp::nn::gpt model(config);
  auto refs = model.parameters();
  REQUIRE(refs.size() == 16);  // wte, wpe, 12 of the block, ln_f: the head is not listed again
  for (std::size_t i = 0; i < refs.size(); ++i)
    for (std::size_t j = i + 1; j < refs.size(); ++j) CHECK(refs[i].value.data != refs[j].value.data);

  // The same model from its layers, the values copied from the GPT's parameters.
  ddp::nn::embedding wte(config.vocab, config.width, 0);
  ddp::nn::position_embedding wpe(config.context, config.width, 0);
  ddp::nn::transformer_block block(config.width, config.heads, 0);
  ddp::nn::layer_norm ln_f(config.width);
  std::vector<ddp::parameter_ref> parts{wte.params()[0].ref(""), wpe.params()[0].ref("")};
  for (auto& p : block.params()) parts.push_back(p.ref(""));
  for (auto& p : ln_f.params()) parts.push_back(p.ref(""));
  for (std::size_t i = 0; i < refs.size(); ++i) {
    const auto from = refs[i].value.as<float>();
    std::copy(from.begin(), from.end(), parts[i].value.as<float>().begin());
  }

  const auto x = random_tokens(3, 4, config.vocab, 14);
  const auto logits = model.forward(x);
  const auto g = random_matrix(logits.rows, logits.cols, 15);
  model.backward(g, ddp::ready_sink{});
  const auto tied = refs[0].grad.as<float>();

  wpe.set_sequence_length(4);
  block.set_sequence_length(4);
  const auto h = ln_f.forward(block.forward(wpe.forward(wte.forward(x.tokens, true), true), true), true);
  const auto w = refs[0].value.as<float>();
  std::vector<double> head(w.size(), 0.0), embedded(w.size(), 0.0);
  for (std::size_t r = 0; r < h.rows; ++r)
    for (std::size_t v = 0; v < config.vocab; ++v) {
      double z = 0;
      for (std::size_t c = 0; c < config.width; ++c) {
        z += static_cast<double>(h(r, c)) * w[v * config.width + c];
        head[v * config.width + c] += static_cast<double>(g(r, v)) * h(r, c);
      }
      CHECK(logits(r, v) == doctest::Approx(z).epsilon(1e-4));
    }
  ddp::nn::matrix dh(h.rows, h.cols);
  for (std::size_t r = 0; r < h.rows; ++r)
    for (std::size_t c = 0; c < config.width; ++c)
      for (std::size_t v = 0; v < config.vocab; ++v) dh(r, c) += g(r, v) * w[v * config.width + c];
  const auto dx = wpe.backward(block.backward(ln_f.backward(dh, true), true), true);
  for (std::size_t r = 0; r < dx.rows; ++r)
    for (std::size_t c = 0; c < config.width; ++c)
      embedded[static_cast<std::size_t>(x.tokens[r]) * config.width + c] += dx(r, c);

  double worst = 0, head_norm = 0, embedded_norm = 0;
  for (std::size_t i = 0; i < tied.size(); ++i) {
    worst = std::max(worst, std::abs(tied[i] - (head[i] + embedded[i])));
    head_norm = std::max(head_norm, std::abs(head[i]));
    embedded_norm = std::max(embedded_norm, std::abs(embedded[i]));
  }
  CHECK(worst <= 1e-5 * (head_norm + embedded_norm));
  // Both uses count: either alone is far from the sum.
  CHECK(head_norm > 1e-3);
  CHECK(embedded_norm > 1e-3);
}

TEST_CASE("the GPT names its parameters as nanoGPT and counts them") {
  ddp::nn::gpt model({});
  const auto refs = model.parameters();
  CHECK(refs.size() == 2 + 4 * 12 + 2);
  CHECK(refs[0].name == "wte.weight");
  CHECK(refs[1].name == "wpe.weight");
  CHECK(refs[2].name == "h.0.ln_1.weight");
  CHECK(refs[4].name == "h.0.attn.c_attn.weight");
  CHECK(refs[13].name == "h.0.mlp.c_proj.bias");
  CHECK(refs[14].name == "h.1.ln_1.weight");
  CHECK(refs[refs.size() - 2].name == "ln_f.weight");
  CHECK(refs.back().name == "ln_f.bias");
  // wte 256*128, wpe 64*128, 4 blocks of 12C² + 13C, ln_f 2C.
  CHECK(model.parameter_count() == 834'304);
  ddp::nn::gpt same({}), other({.seed = 2});
  CHECK(same.parameters()[4].value.as<float>()[3] == refs[4].value.as<float>()[3]);
  CHECK(other.parameters()[4].value.as<float>()[3] != refs[4].value.as<float>()[3]);
  CHECK(ddp::nn::gpt({.context = 256, .layers = 6, .heads = 6, .width = 384}).parameter_count() == 10'844'160);
}

TEST_CASE("the GPT names a batch it cannot take, and a backward without its forward") {
  ddp::nn::gpt model({.vocab = 5, .context = 4, .layers = 1, .heads = 1, .width = 4});
  CHECK_THROWS_WITH(model.forward(random_tokens(1, 5, 5, 1)), doctest::Contains("the length must be in [1, 4]"));
  auto short_batch = random_tokens(2, 3, 5, 1);
  short_batch.tokens.pop_back();
  CHECK_THROWS_WITH(model.forward(short_batch), doctest::Contains("5 tokens for 2 sequences of 3"));
  auto bad = random_tokens(1, 3, 5, 1);
  bad.tokens[1] = 7;
  CHECK_THROWS_WITH(model.forward(bad), doctest::Contains("index 7 at position 1"));
  CHECK_THROWS_WITH(model.backward(ddp::nn::matrix(3, 5), ddp::ready_sink{}),
                    doctest::Contains("backward without a training forward"));
  CHECK_THROWS_WITH(ddp::nn::gpt({.heads = 3}), doctest::Contains("a positive multiple of the heads"));
  CHECK_THROWS_WITH(ddp::nn::gpt({.vocab = 0}), doctest::Contains("ddp[nn] gpt"));
  CHECK_THROWS_WITH(ddp::nn::gpt({.width = 0}), doctest::Contains("ddp[nn] gpt"));
  // A gradient of the wrong shape is refused before the forward's state is touched: the right one
  // still goes through afterwards.
  const auto x = random_tokens(2, 3, 5, 1);
  (void)model.forward(x);
  CHECK_THROWS_WITH(model.backward(ddp::nn::matrix(5, 5), ddp::ready_sink{}),
                    doctest::Contains("5 rows of gradient for a forward of 6 positions"));
  CHECK_NOTHROW(model.backward(ddp::nn::matrix(6, 5), ddp::ready_sink{}));
}

TEST_CASE("nn.md's GPT starts at the loss of a uniform guess over 256 bytes") {
  std::vector<std::int32_t> text(2 * 64 + 1);
  ddp::splitmix64 rng(17);
  for (auto& c : text) c = static_cast<std::int32_t>(rng.below(256));
  CHECK(gpt_loss(text) == doctest::Approx(std::log(256.0)).epsilon(0.01));
}

TEST_CASE("sequence cross-entropy: every position weighs its sequence's weight, averaged over the real positions") {
  const auto logits = random_matrix(6, 4, 16, 2.0f);  // 2 sequences of 3
  const std::vector<std::int32_t> targets{0, 3, 1, 2, 2, 0};
  const auto all = ddp::nn::sequence_cross_entropy(logits, targets);
  const auto plain = ddp::nn::softmax_cross_entropy(logits, targets);
  CHECK(all.loss == plain.loss);
  CHECK(all.grad.data == plain.grad.data);

  // The second sequence is padding: the first's mean, and no gradient for the second.
  const ddp::sample_weights padded{{1.0f, 0.0f}, 1.0, 1};
  const auto ce = ddp::nn::sequence_cross_entropy(logits, targets, padded, 3);
  const auto first = ddp::nn::softmax_cross_entropy(ddp::nn::slice_rows(logits, 0, 3), std::span(targets).first(3));
  CHECK(ce.loss == doctest::Approx(first.loss));
  CHECK(ce.samples == 3.0);
  CHECK(ce.loss_sum == doctest::Approx(3 * first.loss));
  for (std::size_t i = 0; i < 12; ++i) CHECK(ce.grad.data[i] == doctest::Approx(first.grad.data[i]));
  for (std::size_t i = 12; i < 24; ++i) CHECK(ce.grad.data[i] == 0.0f);
  // Two ranks' weights: the divisor is the step's real sequences per rank, times the length.
  const ddp::sample_weights half{{1.0f, 1.0f}, 4.0, 2};
  CHECK(ddp::nn::sequence_cross_entropy(logits, targets, half, 3).loss == doctest::Approx(plain.loss));

  CHECK_THROWS_WITH(ddp::nn::sequence_cross_entropy(logits, targets, padded, 4),
                    doctest::Contains("6 rows of logits are not whole sequences of 4 positions"));
  CHECK_THROWS_WITH(ddp::nn::sequence_cross_entropy(logits, targets, padded, 2),
                    doctest::Contains("3 sequences of 2 positions but 2 sample weights"));
}

}  // namespace transformer_test
