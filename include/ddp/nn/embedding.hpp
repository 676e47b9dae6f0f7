#pragma once
// A learned table of `count` rows of `dim` features, looked up by int32 indices, as PyTorch's
// nn.Embedding(count, dim): forward returns one row per index (rows of the output = indices),
// backward adds each row of dy into the table row it came from. The weight starts N(0, 1) from a
// seed, the same on every rank and device.
//
// Its input is indices, not a matrix, so it is not a layer of a sequential: a module of your own
// looks the rows up and hands them to one (docs/nn.md).
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/random.hpp"
#include "ddp/nn/layer.hpp"

namespace ddp::nn {

// N(0, 1) draws (Box-Muller) from `seed`: the same numbers on every device.
inline void initialise_embedding(std::span<float> weight, std::uint64_t seed) {
  splitmix64 rng(seed);
  for (std::size_t i = 0; i < weight.size(); i += 2) {
    const double u1 = static_cast<double>((rng.next() >> 11) + 1) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 6.283185307179586477 * u2;
    weight[i] = static_cast<float>(r * std::cos(a));
    if (i + 1 < weight.size()) weight[i + 1] = static_cast<float>(r * std::sin(a));
  }
}

// Every index in [0, count), or an error naming the first that is not.
inline void check_indices(std::span<const std::int32_t> indices, std::size_t count, const char* layer) {
  for (std::size_t i = 0; i < indices.size(); ++i)
    if (indices[i] < 0 || static_cast<std::size_t>(indices[i]) >= count)
      throw error("nn", std::string(layer) + " forward", -1,
                  "index " + std::to_string(indices[i]) + " at position " + std::to_string(i) +
                      " is outside the table's rows [0, " + std::to_string(count) +
                      "); build the embedding with more rows, or map the ids into that range first");
}

class embedding {
 public:
  using matrix_type = matrix;

  embedding(std::size_t count, std::size_t dim, std::uint64_t seed) : count_(count), dim_(dim) {
    if (count == 0 || dim == 0)
      throw error("nn", "embedding", -1,
                  "a table of " + std::to_string(count) + " x " + std::to_string(dim) + ": both must be positive");
    params_.emplace_back("weight", shape_t{static_cast<std::int64_t>(count), static_cast<std::int64_t>(dim)});
    initialise_embedding(params_[0].value(), seed);
  }

  matrix forward(std::span<const std::int32_t> indices, bool training) {
    check_indices(indices, count_, "embedding");
    matrix y(indices.size(), dim_);
    const float* w = params_[0].value().data();
    for (std::size_t r = 0; r < indices.size(); ++r)
      std::copy(w + static_cast<std::size_t>(indices[r]) * dim_, w + (static_cast<std::size_t>(indices[r]) + 1) * dim_,
                y.row(r));
    if (training) saved_.emplace_back(indices.begin(), indices.end());
    return y;
  }

  // Adds row r of dy into the table row of the forward's index r, in index order: repeated
  // indices sum in the same order on every run. Indices have no gradient: returns an empty matrix.
  matrix backward(const matrix& dy, bool /*need_dx*/ = false) {
    const auto indices = pop_saved(saved_, "embedding");
    require_cols(dy, dim_, "embedding backward");
    if (dy.rows != indices.size())
      throw error("nn", "embedding backward", -1,
                  std::to_string(dy.rows) + " rows of gradient for a forward of " + std::to_string(indices.size()) +
                      " indices; pass one row per index, in the forward's order");
    float* g = params_[0].grad().data();
    for (std::size_t r = 0; r < indices.size(); ++r) {
      float* row = g + static_cast<std::size_t>(indices[r]) * dim_;
      const float* d = dy.row(r);
      for (std::size_t c = 0; c < dim_; ++c) row[c] += d[c];
    }
    return {};
  }

  std::span<parameter> params() noexcept { return params_; }
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }
  std::size_t count() const noexcept { return count_; }
  std::size_t dim() const noexcept { return dim_; }

 private:
  std::size_t count_, dim_;
  std::vector<parameter> params_;
  std::vector<std::vector<std::int32_t>> saved_;
};

}  // namespace ddp::nn
