#pragma once
#include <vector>

#include "ddp/nn/layer.hpp"

namespace ddp::nn {

class relu {
 public:
  using matrix_type = matrix;
  matrix forward(const matrix& x, bool training) {
    matrix y = x;
    for (auto& v : y.data) v = v > 0.0f ? v : 0.0f;
    if (training) saved_.push_back(y);
    return y;
  }
  matrix backward(const matrix& dy, bool need_dx) {
    const matrix y = pop_saved(saved_, "relu");
    if (!need_dx) return {};
    matrix dx = dy;
    for (std::size_t i = 0; i < dx.size(); ++i) dx.data[i] = y.data[i] > 0.0f ? dx.data[i] : 0.0f;
    return dx;
  }
  std::span<parameter> params() noexcept { return {}; }
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }

 private:
  std::vector<matrix> saved_;
};

}  // namespace ddp::nn
