#pragma once
// A learned position embedding on a GPU: ddp::nn::position_embedding's behaviour and table (the
// same seed gives the same weights), y = x + weight[t] for the row of position t, and its
// backward summed in the host's order (the same bits).
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/nn/cuda/matrix.hpp"
#include "ddp/nn/cuda/parameter.hpp"
#include "ddp/nn/embedding.hpp"
#include "ddp/nn/layer.hpp"
#include "ddp/nn/position_embedding.hpp"

namespace ddp::nn::cuda {

class position_embedding {
 public:
  using matrix_type = matrix;

  position_embedding(ddp::cuda::device& dev, std::size_t context, std::size_t width, std::uint64_t seed)
      : dev_(&dev), context_(context), width_(width) {
    if (context == 0 || width == 0)
      throw error("nn", "cuda::position_embedding", -1,
                  "a table of " + std::to_string(context) + " x " + std::to_string(width) + ": both must be positive");
    std::vector<float> w(context * width);
    ddp::nn::initialise_embedding(w, seed);
    params_.emplace_back(dev, "weight", shape_t{static_cast<std::int64_t>(context), static_cast<std::int64_t>(width)},
                         w);
  }

  void set_sequence_length(std::size_t length) noexcept { length_ = length; }
  std::size_t sequence_length() const noexcept { return length_; }

  matrix forward(const matrix& x, bool training) {
    require_cols(x, width_, "position_embedding");
    ddp::nn::check_positions(x.rows(), length_, context_, "cuda::position_embedding");
    matrix y(*dev_, x.rows(), width_);
    run(kernels::position_forward(x.data(), params_[0].value(), y.data(), x.rows(), length_, width_, stream()),
        "position_forward kernel");
    if (training) saved_.push_back(length_);
    return y;
  }

  matrix backward(const matrix& dy, bool need_dx) {
    const std::size_t length = ddp::nn::pop_saved(saved_, "position_embedding");
    require_cols(dy, width_, "position_embedding backward");
    run(kernels::position_backward(params_[0].grad(), dy.data(), dy.rows(), length, width_, stream()),
        "position_backward kernel");
    if (!need_dx) return {};
    return dy;
  }

  std::span<parameter> params() noexcept { return params_; }
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }
  std::size_t context() const noexcept { return context_; }
  std::size_t width() const noexcept { return width_; }

 private:
  cudaStream_t stream() const noexcept { return dev_->stream(); }
  void run(cudaError_t status, const char* kernel) const { ddp::cuda::check(status, kernel, dev_->site()); }

  ddp::cuda::device* dev_;
  std::size_t context_, width_;
  std::size_t length_ = 0;
  std::vector<parameter> params_;
  std::vector<std::size_t> saved_;
};

}  // namespace ddp::nn::cuda
