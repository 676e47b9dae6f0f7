#pragma once
// Multi-head self-attention on a GPU: ddp::nn::attention's behaviour, parameter names and
// initialisation (the same seed gives the same weights), its projections ddp::nn::cuda::linear
// (cuBLAS). Per (sequence, head), the scores, the heads' outputs and their gradients come from
// one strided-batched SGEMM each over every sequence and head; the softmax and its backward (f32,
// causal or not, masked entries exactly 0) are ddp::cuda::attention_softmax's kernels; the heads
// are split from and merged into rows by permuting kernels.
//
// A training forward keeps its input, q, k and v as [B, H, T, D] (3 B*T x C), the merged heads
// (B*T x C) and the B*H*T*T probabilities until backward.
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/nn/cuda/attention_softmax.hpp"
#include "ddp/cuda/blas.hpp"
#include "ddp/nn/attention.hpp"
#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/nn/cuda/linear.hpp"
#include "ddp/nn/cuda/matrix.hpp"
#include "ddp/nn/cuda/parameter.hpp"
#include "ddp/nn/layer.hpp"
#include "ddp/nn/residual.hpp"

namespace ddp::nn::cuda {

namespace detail {

// nanoGPT's initialisation of a linear layer, as the host layers give it: the weight N(0, std)
// from `seed` (ddp::nn::initialise_normal), the bias 0.
inline void initialise_gpt_linear(ddp::cuda::device& dev, linear& l, float std, std::uint64_t seed) {
  std::vector<float> w(l.params()[0].size());
  ddp::nn::initialise_normal(w, std, seed);
  dev.copy_from_host(l.params()[0].value(), w.data(), w.size() * sizeof(float));
  dev.fill_zero(l.params()[1].value(), l.params()[1].size() * sizeof(float));
}

}  // namespace detail

class attention {
 public:
  using matrix_type = matrix;

  // c_attn's weight from `seed`, c_proj's from seed + 1 (scaled by projection_scale), biases 0.
  attention(ddp::cuda::device& dev, std::size_t width, std::size_t heads, std::uint64_t seed, bool causal = true,
            float projection_scale = 1.0f)
      : dev_(&dev), width_(width), heads_(heads), causal_(causal), c_attn_(dev, width, 3 * width, seed),
        c_proj_(dev, width, width, seed + 1) {
    if (width == 0 || heads == 0 || width % heads != 0)
      throw error("nn", "cuda::attention", -1,
                  "width " + std::to_string(width) + " over " + std::to_string(heads) +
                      " heads: the width must be a positive multiple of the number of heads");
    detail::initialise_gpt_linear(dev, c_attn_, 0.02f, seed);
    detail::initialise_gpt_linear(dev, c_proj_, 0.02f * projection_scale, seed + 1);
  }

  // T: the input's rows are sequences of this many positions.
  void set_sequence_length(std::size_t length) noexcept { length_ = length; }
  std::size_t sequence_length() const noexcept { return length_; }

  matrix forward(const matrix& x, bool training) {
    require_cols(x, width_, "attention");
    const std::size_t t = checked_length(x.rows()), b = x.rows() / t, n = x.rows(), c = width_, h = heads_;
    const std::size_t d = c / h, bh = b * h;
    saved s{matrix(*dev_, n, c), matrix(*dev_, n, c), matrix(*dev_, n, c), matrix(*dev_, bh * t, t)};
    {
      const matrix qkv = c_attn_.forward(x, training);
      for (std::size_t part = 0; part < 3; ++part)
        run(kernels::heads_from_rows(qkv.data(), 3 * c, part * c, s.part(part).data(), b, t, h, d, stream()),
            "heads_from_rows kernel");
    }
    // probabilities = softmax(q k^T / sqrt(D)), in place of the scores; heads = probabilities v
    ddp::cuda::blas::gemm_strided_batched(*dev_, false, true, t, t, d, scale(), s.q.data(), d, t * d, s.k.data(), d,
                                          t * d, 0.0f, s.probs.data(), t, t * t, bh);
    attention_softmax(*dev_, s.probs.data(), s.probs.data(), bh, t, t, 1.0f, causal_);
    matrix y(*dev_, n, c);
    {
      matrix heads(*dev_, n, c);
      ddp::cuda::blas::gemm_strided_batched(*dev_, false, false, t, d, t, 1.0f, s.probs.data(), t, t * t, s.v.data(),
                                            d, t * d, 0.0f, heads.data(), d, t * d, bh);
      run(kernels::rows_from_heads(heads.data(), y.data(), c, 0, b, t, h, d, stream()), "rows_from_heads kernel");
    }
    matrix out = c_proj_.forward(y, training);
    if (training) saved_.push_back(std::move(s));
    return out;
  }

  // With P a head's probabilities and dY its part of d loss / d y: dV = P^T dY, dP = dY V^T,
  // dS = P o (dP - rowsum(P o dP)), dQ = dS K / sqrt(D), dK = dS^T Q / sqrt(D).
  matrix backward(const matrix& dy, bool need_dx) {
    const saved s = ddp::nn::pop_saved(saved_, "attention");
    const std::size_t t = s.probs.cols(), n = s.q.rows(), b = n / t, c = width_, h = heads_;
    const std::size_t d = c / h, bh = b * h;
    matrix dheads(*dev_, n, c);
    {
      const matrix dmerged = c_proj_.backward(dy, true);
      run(kernels::heads_from_rows(dmerged.data(), c, 0, dheads.data(), b, t, h, d, stream()),
          "heads_from_rows kernel");
    }
    matrix dqkv(*dev_, n, 3 * c);
    {
      matrix ds(*dev_, bh * t, t), dpart(*dev_, n, c);
      auto place = [&](std::size_t part) {
        run(kernels::rows_from_heads(dpart.data(), dqkv.data(), 3 * c, part * c, b, t, h, d, stream()),
            "rows_from_heads kernel");
      };
      ddp::cuda::blas::gemm_strided_batched(*dev_, true, false, t, d, t, 1.0f, s.probs.data(), t, t * t,
                                            dheads.data(), d, t * d, 0.0f, dpart.data(), d, t * d, bh);
      place(2);  // dV
      ddp::cuda::blas::gemm_strided_batched(*dev_, false, true, t, t, d, 1.0f, dheads.data(), d, t * d, s.v.data(), d,
                                            t * d, 0.0f, ds.data(), t, t * t, bh);
      attention_softmax_backward(*dev_, s.probs.data(), ds.data(), ds.data(), bh, t, t, 1.0f, causal_);
      ddp::cuda::blas::gemm_strided_batched(*dev_, false, false, t, d, t, scale(), ds.data(), t, t * t, s.k.data(), d,
                                            t * d, 0.0f, dpart.data(), d, t * d, bh);
      place(0);  // dQ
      ddp::cuda::blas::gemm_strided_batched(*dev_, true, false, t, d, t, scale(), ds.data(), t, t * t, s.q.data(), d,
                                            t * d, 0.0f, dpart.data(), d, t * d, bh);
      place(1);  // dK
    }
    return c_attn_.backward(dqkv, need_dx);
  }

  // "c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias".
  std::vector<nested_parameter<parameter>> params() {
    std::vector<nested_parameter<parameter>> out;
    for (auto& p : c_attn_.params()) out.emplace_back(p, "c_attn.");
    for (auto& p : c_proj_.params()) out.emplace_back(p, "c_proj.");
    return out;
  }
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }

  std::size_t width() const noexcept { return width_; }
  std::size_t heads() const noexcept { return heads_; }
  bool causal() const noexcept { return causal_; }
  linear& c_attn() noexcept { return c_attn_; }
  linear& c_proj() noexcept { return c_proj_; }

 private:
  struct saved {
    matrix q, k, v;  // [B, H, T, D], each B*T x C floats
    matrix probs;    // B*H*T rows of T
    matrix& part(std::size_t i) { return i == 0 ? q : i == 1 ? k : v; }
  };

  cudaStream_t stream() const noexcept { return dev_->stream(); }
  void run(cudaError_t status, const char* kernel) const { ddp::cuda::check(status, kernel, dev_->site()); }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(width_ / heads_)); }
  // The rows' sequence length, or an error naming the fix.
  std::size_t checked_length(std::size_t rows) const {
    return ddp::nn::checked_sequence_length(length_, rows, "cuda::attention");
  }

  ddp::cuda::device* dev_;
  std::size_t width_, heads_;
  bool causal_;
  std::size_t length_ = 0;
  linear c_attn_, c_proj_;
  std::vector<saved> saved_;
};

}  // namespace ddp::nn::cuda
