#pragma once
// A row-major batch of feature vectors in one GPU's memory: the CUDA twin of ddp::nn::matrix.
#include <stdexcept>
#include <string>

#include "ddp/cuda/device_vector.hpp"
#include "ddp/nn/matrix.hpp"

namespace ddp::nn::cuda {

class matrix {
 public:
  matrix() = default;
  matrix(ddp::cuda::device& dev, std::size_t rows, std::size_t cols)
      : rows_(rows), cols_(cols), data_(dev, rows * cols) {}

  static matrix from_host(ddp::cuda::device& dev, const ddp::nn::matrix& host) {
    matrix m;
    m.rows_ = host.rows;
    m.cols_ = host.cols;
    m.data_ = ddp::cuda::device_vector<float>::from_host(dev, host.data);
    return m;
  }
  // Waits for the device's stream.
  ddp::nn::matrix to_host() const {
    ddp::nn::matrix out(rows_, cols_);
    out.data = data_.to_host();
    return out;
  }

  std::size_t rows() const noexcept { return rows_; }
  std::size_t cols() const noexcept { return cols_; }
  std::size_t size() const noexcept { return rows_ * cols_; }
  float* data() noexcept { return data_.data(); }
  const float* data() const noexcept { return data_.data(); }
  ddp::cuda::device& device() const noexcept { return data_.device(); }

 private:
  std::size_t rows_ = 0, cols_ = 0;
  ddp::cuda::device_vector<float> data_;
};

inline void require_cols(const matrix& x, std::size_t cols, const std::string& layer) {
  if (x.cols() != cols)
    throw std::invalid_argument("ddp::nn::cuda: " + layer + " expects " + std::to_string(cols) +
                                " features per sample, got " + std::to_string(x.cols()));
}

}  // namespace ddp::nn::cuda
