#pragma once
// A learned position embedding, as GPT-2's wpe: y = x + weight[t] for the row of position t. The
// input's rows are B sequences of T positions each (row b*T + t), T told with
// set_sequence_length(T), at most the table's `context` rows. Backward adds each row of dy into
// its position's row, sequence by sequence (the same order on every run), and passes dy on as dx.
// The weight starts N(0, 1) from a seed, as PyTorch's nn.Embedding (ddp::nn::gpt scales it to
// nanoGPT's 0.02).
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/nn/embedding.hpp"
#include "ddp/nn/layer.hpp"

namespace ddp::nn {

// T in [1, context] dividing the rows (the host layer's and its CUDA twin's check), or an error
// naming `layer` and the fix.
inline void check_positions(std::size_t rows, std::size_t length, std::size_t context, const char* layer) {
  if (length == 0 || length > context || rows % length != 0)
    throw error("nn", layer, -1,
                std::to_string(rows) + " rows in sequences of " + std::to_string(length) +
                    " positions: set_sequence_length(T) with T in [1, " + std::to_string(context) +
                    "] (the table's rows) dividing the rows");
}

class position_embedding {
 public:
  using matrix_type = matrix;

  position_embedding(std::size_t context, std::size_t width, std::uint64_t seed) : context_(context), width_(width) {
    if (context == 0 || width == 0)
      throw error("nn", "position_embedding", -1,
                  "a table of " + std::to_string(context) + " x " + std::to_string(width) + ": both must be positive");
    params_.emplace_back("weight", shape_t{static_cast<std::int64_t>(context), static_cast<std::int64_t>(width)});
    initialise_embedding(params_[0].value(), seed);
  }

  void set_sequence_length(std::size_t length) noexcept { length_ = length; }
  std::size_t sequence_length() const noexcept { return length_; }

  matrix forward(const matrix& x, bool training) {
    require_cols(x, width_, "position_embedding");
    check_positions(x.rows, length_, context_, "position_embedding");
    matrix y = x;
    const float* w = params_[0].value().data();
    for (std::size_t r = 0; r < y.rows; ++r) {
      const float* p = w + (r % length_) * width_;
      float* out = y.row(r);
      for (std::size_t c = 0; c < width_; ++c) out[c] += p[c];
    }
    if (training) saved_.push_back(length_);
    return y;
  }

  matrix backward(const matrix& dy, bool need_dx) {
    const std::size_t length = pop_saved(saved_, "position_embedding");
    require_cols(dy, width_, "position_embedding backward");
    float* g = params_[0].grad().data();
    for (std::size_t r = 0; r < dy.rows; ++r) {
      float* row = g + (r % length) * width_;
      const float* d = dy.row(r);
      for (std::size_t c = 0; c < width_; ++c) row[c] += d[c];
    }
    if (!need_dx) return {};
    return dy;
  }

  std::span<parameter> params() noexcept { return params_; }
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }
  std::size_t context() const noexcept { return context_; }
  std::size_t width() const noexcept { return width_; }

 private:
  std::size_t context_, width_;
  std::size_t length_ = 0;
  std::vector<parameter> params_;
  std::vector<std::size_t> saved_;
};

}  // namespace ddp::nn
