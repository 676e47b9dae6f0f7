#pragma once
// An embedding table on a GPU: ddp::nn::embedding's lookup, initialisation (the same seed gives
// the same table) and deterministic backward. The indices come from host memory, are checked
// there and uploaded with each forward.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/nn/cuda/matrix.hpp"
#include "ddp/nn/cuda/parameter.hpp"
#include "ddp/nn/embedding.hpp"
#include "ddp/nn/layer.hpp"

namespace ddp::nn::cuda {

class embedding {
 public:
  using matrix_type = matrix;

  embedding(ddp::cuda::device& dev, std::size_t count, std::size_t dim, std::uint64_t seed)
      : dev_(&dev), count_(count), dim_(dim) {
    if (count == 0 || dim == 0)
      throw error("nn", "cuda::embedding", -1,
                  "a table of " + std::to_string(count) + " x " + std::to_string(dim) + ": both must be positive");
    std::vector<float> w(count * dim);
    ddp::nn::initialise_embedding(w, seed);
    params_.emplace_back(dev, "weight", shape_t{static_cast<std::int64_t>(count), static_cast<std::int64_t>(dim)}, w);
  }

  matrix forward(std::span<const std::int32_t> indices, bool training) {
    ddp::nn::check_indices(indices, count_, "cuda::embedding");
    auto on_device = ddp::cuda::device_vector<std::int32_t>::from_host(*dev_, indices);
    matrix y(*dev_, indices.size(), dim_);
    run(kernels::embedding_forward(params_[0].value(), on_device.data(), y.data(), indices.size(), dim_, stream()),
        "embedding_forward kernel");
    if (training) saved_.push_back(std::move(on_device));
    return y;
  }

  // Indices have no gradient: returns an empty matrix.
  matrix backward(const matrix& dy, bool /*need_dx*/ = false) {
    const auto indices = ddp::nn::pop_saved(saved_, "embedding");
    require_cols(dy, dim_, "embedding backward");
    if (dy.rows() != indices.size())
      throw error("nn", "cuda::embedding backward", -1,
                  std::to_string(dy.rows()) + " rows of gradient for a forward of " + std::to_string(indices.size()) +
                      " indices; pass one row per index, in the forward's order");
    run(kernels::embedding_backward(params_[0].grad(), indices.data(), dy.data(), dy.rows(), dim_, stream()),
        "embedding_backward kernel");
    return {};
  }

  std::span<parameter> params() noexcept { return params_; }
  std::vector<buffer_ref> buffer_refs(const std::string&) { return {}; }

 private:
  cudaStream_t stream() const noexcept { return dev_->stream(); }
  void run(cudaError_t status, const char* kernel) const { ddp::cuda::check(status, kernel, dev_->site()); }

  ddp::cuda::device* dev_;
  std::size_t count_, dim_;
  std::vector<parameter> params_;
  std::vector<ddp::cuda::device_vector<std::int32_t>> saved_;
};

}  // namespace ddp::nn::cuda
