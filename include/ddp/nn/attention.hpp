#pragma once
// Multi-head self-attention, as nanoGPT's CausalSelfAttention: one fused projection to queries,
// keys and values (c_attn: weight [3C, C], bias [3C]), the heads split (D = C / heads columns
// each), att = softmax(q kᵀ / √D), with the causal mask when asked (a position sees itself and
// the positions before it), y = att v, the heads merged, and the output projection (c_proj:
// weight [C, C], bias [C]).
//
// The input's rows are B sequences of T positions each, row b*T + t; the layer is told T with
// set_sequence_length(T) (ddp::nn::transformer_block and ddp::nn::gpt tell it on each forward).
// The softmax is computed in f32 with the row's maximum subtracted; masked probabilities are
// exactly 0, so no gradient reaches a position from the outputs before it (the host device's
// attention_softmax contract, ddp/host/softmax_rows.hpp's vectorised loops). Matrix products go
// through CBLAS, per sequence and head, and under the mask per block of rows, each reading the
// columns it can see only. A training forward keeps its input, the projections
// (B*T x 3C), the merged heads (B*T x C) and the B*H*T*T probabilities for backward; their
// storage, and the step's scratch, is kept for the next step's (ddp/nn/saved_stack.hpp).
//
// Weights start N(0, 0.02) and biases 0, as nanoGPT initialises them, from a seed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/host/softmax_rows.hpp"
#include "ddp/nn/blas.hpp"
#include "ddp/nn/embedding.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/residual.hpp"
#include "ddp/nn/saved_stack.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::nn {

// The rows' sequence length (the host layer's and its CUDA twin's), or an error naming `layer` and
// the fix.
inline std::size_t checked_sequence_length(std::size_t length, std::size_t rows, const char* layer) {
  if (length == 0)
    throw error("nn", layer, -1,
                "no sequence length: call set_sequence_length(T) before forward (the input's rows are sequences "
                "of T positions)");
  if (rows % length != 0)
    throw error("nn", layer, -1,
                std::to_string(rows) + " rows are not whole sequences of " + std::to_string(length) +
                    " positions; pass B*T rows, or set_sequence_length to the batch's T");
  return length;
}

// N(0, std) draws from `seed` (initialise_embedding's N(0, 1), scaled): nanoGPT's initialisation.
inline void initialise_normal(std::span<float> values, float std, std::uint64_t seed) {
  initialise_embedding(values, seed);
  for (auto& v : values) v *= std;
}

class attention {
 public:
  using matrix_type = matrix;

  // c_attn's weight from `seed`, c_proj's from seed + 1 (scaled by projection_scale: nanoGPT
  // scales it by 1/sqrt(2 * layers)).
  attention(std::size_t width, std::size_t heads, std::uint64_t seed, bool causal = true,
            float projection_scale = 1.0f);

  // T: the input's rows are sequences of this many positions.
  void set_sequence_length(std::size_t length) noexcept { length_ = length; }
  std::size_t sequence_length() const noexcept { return length_; }

  matrix forward(const matrix& x, bool training);
  // The same, c_attn keeping x's own storage for backward instead of a copy.
  matrix forward(matrix&& x, bool training);
  matrix backward(const matrix& dy, bool need_dx);

  // "c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias".
  std::vector<nested_parameter<parameter>> params();
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }

  std::size_t width() const noexcept { return width_; }
  std::size_t heads() const noexcept { return heads_; }
  bool causal() const noexcept { return causal_; }
  linear& c_attn() noexcept { return c_attn_; }
  linear& c_proj() noexcept { return c_proj_; }

 private:
  struct saved {
    matrix qkv;                        // B*T x 3C: q, k, v side by side
    std::vector<float> probabilities;  // B*H*T*T, sequence-major then head
    std::size_t length = 0;
  };
  // The rows' sequence length, or an error naming the fix.
  std::size_t checked_length(std::size_t rows) const;
  // The heads over the projections of x (c_attn's output), then c_proj.
  matrix attend(matrix qkv, bool training);
  // Rows per block of the score products: under the causal mask a block skips the columns after
  // its end (about half the products' work for many blocks, at more calls of fewer rows each).
  std::size_t causal_block_rows(std::size_t t) const noexcept { return causal_ ? (t <= 128 ? 32 : 64) : t; }

  std::size_t width_, heads_;
  bool causal_;
  std::size_t length_ = 0;
  linear c_attn_, c_proj_;
  saved_stack<saved> saved_;
  // Scratch of one call, kept for the next: the merged heads (forward), the projections'
  // gradient (backward), a head's scores or their gradient.
  matrix merged_, dqkv_;
  std::vector<float> scores_;
};

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE attention::attention(std::size_t width, std::size_t heads, std::uint64_t seed, bool causal,
                                        float projection_scale)
    : width_(width), heads_(heads), causal_(causal), c_attn_(width, 3 * width, seed), c_proj_(width, width, seed + 1) {
  if (width == 0 || heads == 0 || width % heads != 0)
    throw error("nn", "attention", -1,
                "width " + std::to_string(width) + " over " + std::to_string(heads) +
                    " heads: the width must be a positive multiple of the number of heads");
  initialise_normal(c_attn_.params()[0].value(), 0.02f, seed);
  initialise_normal(c_proj_.params()[0].value(), 0.02f * projection_scale, seed + 1);
  for (auto* l : {&c_attn_, &c_proj_}) std::fill(l->params()[1].value().begin(), l->params()[1].value().end(), 0.0f);
}

DDP_RUNTIME_INLINE std::vector<nested_parameter<parameter>> attention::params() {
  std::vector<nested_parameter<parameter>> out;
  for (auto& p : c_attn_.params()) out.emplace_back(p, "c_attn.");
  for (auto& p : c_proj_.params()) out.emplace_back(p, "c_proj.");
  return out;
}

DDP_RUNTIME_INLINE std::size_t attention::checked_length(std::size_t rows) const {
  return checked_sequence_length(length_, rows, "attention");
}

DDP_RUNTIME_INLINE matrix attention::forward(const matrix& x, bool training) {
  require_cols(x, width_, "attention");
  checked_length(x.rows);
  return attend(c_attn_.forward(x, training), training);
}

DDP_RUNTIME_INLINE matrix attention::forward(matrix&& x, bool training) {
  require_cols(x, width_, "attention");
  checked_length(x.rows);
  return attend(c_attn_.forward(std::move(x), training), training);
}

DDP_RUNTIME_INLINE matrix attention::attend(matrix qkv, bool training) {
  const std::size_t rows = qkv.rows, t = checked_length(rows), b_count = rows / t, c = width_, d = c / heads_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  reshape(merged_, rows, c);
  std::vector<float>* probabilities = &scores_;
  if (training) {
    saved& st = saved_.push();
    st.length = t;
    probabilities = &st.probabilities;
  }
  probabilities->resize(training ? b_count * heads_ * t * t : t * t);
  const std::size_t block = causal_block_rows(t);
  for (std::size_t b = 0; b < b_count; ++b)
    for (std::size_t h = 0; h < heads_; ++h) {
      const float* q = qkv.row(b * t) + h * d;
      float* s = probabilities->data() + (training ? (b * heads_ + h) * t * t : 0);
      float* y = merged_.row(b * t) + h * d;
      // Under the mask, the rows of a block see the columns before the block's end only: the
      // scores beyond are not computed (the softmax writes their probabilities as 0).
      for (std::size_t r0 = 0; r0 < t; r0 += block) {
        const std::size_t rows = std::min(block, t - r0), seen = causal_ ? r0 + rows : t;
        blas::gemm(false, true, rows, seen, d, 1.0f, q + r0 * 3 * c, 3 * c, q + c, 3 * c, 0.0f, s + r0 * t, t);
      }
      host::softmax_rows(s, s, 1, t, t, scale, causal_);
      for (std::size_t r0 = 0; r0 < t; r0 += block) {
        const std::size_t rows = std::min(block, t - r0), seen = causal_ ? r0 + rows : t;
        blas::gemm(false, false, rows, d, seen, 1.0f, s + r0 * t, t, q + 2 * c, 3 * c, 0.0f, y + r0 * c, c);
      }
    }
  if (training) saved_.back().qkv = std::move(qkv);
  // c_proj keeps merged_'s storage for backward, leaving merged_ its spare storage for the next call.
  return c_proj_.forward(std::move(merged_), training);
}

// With P a head's probabilities and dY its part of d loss / d y: dV = Pᵀ dY, dP = dY Vᵀ,
// dS = P ∘ (dP − rowsum(P ∘ dP)) / √D, dQ = dS K, dK = dSᵀ Q.
DDP_RUNTIME_INLINE matrix attention::backward(const matrix& dy, bool need_dx) {
  const auto st = saved_.pop("attention");
  const std::size_t t = st->length, c = width_, d = c / heads_, b_count = st->qkv.rows / t;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const matrix dheads = c_proj_.backward(dy, true);
  reshape(dqkv_, st->qkv.rows, 3 * c);
  scores_.resize(t * t);
  float* ds = scores_.data();
  const std::size_t block = causal_block_rows(t);
  // Under the mask P and dS are 0 above the diagonal: a block of rows reads the columns before
  // its end only, a block of columns the rows from its start on.
  auto seen = [&](std::size_t r0, std::size_t rows) { return causal_ ? r0 + rows : t; };
  auto first_row = [&](std::size_t c0) { return causal_ ? c0 : std::size_t{0}; };
  for (std::size_t b = 0; b < b_count; ++b)
    for (std::size_t h = 0; h < heads_; ++h) {
      const float* q = st->qkv.row(b * t) + h * d;
      const float* p = st->probabilities.data() + (b * heads_ + h) * t * t;
      const float* g = dheads.row(b * t) + h * d;
      float* dq = dqkv_.row(b * t) + h * d;
      for (std::size_t c0 = 0; c0 < t; c0 += block) {  // dV = Pᵀ dY
        const std::size_t cols = std::min(block, t - c0), r0 = first_row(c0);
        blas::gemm(true, false, cols, d, t - r0, 1.0f, p + r0 * t + c0, t, g + r0 * c, c, 0.0f,
                   dq + 2 * c + c0 * 3 * c, 3 * c);
      }
      for (std::size_t r0 = 0; r0 < t; r0 += block) {  // dP = dY Vᵀ
        const std::size_t rows = std::min(block, t - r0);
        blas::gemm(false, true, rows, seen(r0, rows), d, 1.0f, g + r0 * c, c, q + 2 * c, 3 * c, 0.0f, ds + r0 * t, t);
      }
      host::softmax_rows_backward(p, ds, ds, 1, t, t, scale, causal_);
      for (std::size_t r0 = 0; r0 < t; r0 += block) {  // dQ = dS K
        const std::size_t rows = std::min(block, t - r0);
        blas::gemm(false, false, rows, d, seen(r0, rows), 1.0f, ds + r0 * t, t, q + c, 3 * c, 0.0f, dq + r0 * 3 * c,
                   3 * c);
      }
      for (std::size_t c0 = 0; c0 < t; c0 += block) {  // dK = dSᵀ Q
        const std::size_t cols = std::min(block, t - c0), r0 = first_row(c0);
        blas::gemm(true, false, cols, d, t - r0, 1.0f, ds + r0 * t + c0, t, q + r0 * 3 * c, 3 * c, 0.0f,
                   dq + c + c0 * 3 * c, 3 * c);
      }
    }
  return c_attn_.backward(dqkv_, need_dx);
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::nn
