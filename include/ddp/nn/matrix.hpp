#pragma once
// A row-major batch of feature vectors in host memory: rows = samples, cols = features.
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::nn {

struct matrix {
  std::size_t rows = 0, cols = 0;
  std::vector<float> data;

  matrix() = default;
  matrix(std::size_t r, std::size_t c, float fill = 0.0f) : rows(r), cols(c), data(r * c, fill) {}

  float* row(std::size_t r) noexcept { return data.data() + r * cols; }
  const float* row(std::size_t r) const noexcept { return data.data() + r * cols; }
  float& operator()(std::size_t r, std::size_t c) noexcept { return data[r * cols + c]; }
  float operator()(std::size_t r, std::size_t c) const noexcept { return data[r * cols + c]; }
  std::size_t size() const noexcept { return data.size(); }
};

// Rows [begin, end) as a new matrix.
inline matrix slice_rows(const matrix& m, std::size_t begin, std::size_t end) {
  matrix out(end - begin, m.cols);
  std::copy(m.row(begin), m.row(begin) + out.size(), out.data.begin());
  return out;
}

inline void require_cols(const matrix& x, std::size_t cols, const std::string& layer) {
  if (x.cols != cols)
    throw std::invalid_argument("ddp::nn: " + layer + " expects " + std::to_string(cols) +
                                " features per sample, got " + std::to_string(x.cols));
}

}  // namespace ddp::nn
