#pragma once
// Softmax cross-entropy of GPU logits: the loss, the metric's sum and count, and the correct
// count come back to the host (one small copy per batch), the gradient stays on the GPU. As the
// host's ddp::nn::softmax_cross_entropy: unweighted, the mean over the batch; with a loader's
// sample weights, the weighted sum divided by weights.divisor() (padding counts for nothing).
#include <cstdint>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>

#include "ddp/core/sample_weights.hpp"
#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/nn/cuda/matrix.hpp"
#include "ddp/nn/cross_entropy.hpp"

namespace ddp::nn::cuda {

using cross_entropy_result = ddp::nn::basic_cross_entropy_result<matrix>;

namespace detail {

inline cross_entropy_result softmax_cross_entropy(const matrix& logits,
                                                  const ddp::cuda::device_vector<std::int32_t>& labels,
                                                  std::span<const float> weights, double divisor) {
  ddp::nn::detail::check_cross_entropy_arguments("ddp::nn::cuda::softmax_cross_entropy", logits.rows(), labels.size(),
                                                weights.size(), divisor);
  auto& dev = logits.device();
  const std::size_t n = logits.rows();
  cross_entropy_result out{0.0, matrix(dev, n, logits.cols()), 0, 0.0, 0.0};
  // One allocation for the per-row results, so one copy brings them back: loss (double), then
  // correct flags, then the first bad label (int32).
  const std::size_t words = n + (n + 2) / 2 + 1;
  ddp::cuda::device_vector<double> scratch(dev, words);
  auto* row_loss = scratch.data();
  auto* correct = reinterpret_cast<std::int32_t*>(scratch.data() + n);
  auto* bad = correct + n;
  const std::int32_t none = -1;
  dev.copy_from_host(bad, &none, sizeof none);
  const auto device_weights = ddp::cuda::device_vector<float>::from_host(dev, weights);
  const double inv_divisor = 1.0 / divisor;
  ddp::cuda::check(kernels::softmax_cross_entropy(logits.data(), labels.data(),
                                                  weights.empty() ? nullptr : device_weights.data(), inv_divisor, n,
                                                  logits.cols(), out.grad.data(), row_loss, correct, bad, dev.stream()),
                   "softmax_cross_entropy kernel", dev.site());
  const auto host = scratch.to_host();
  const auto* host_correct = reinterpret_cast<const std::int32_t*>(host.data() + n);
  if (const std::int32_t b = host_correct[n]; b != -1)
    throw std::invalid_argument("ddp::nn::cuda::softmax_cross_entropy: label " + std::to_string(b) + " outside [0, " +
                                std::to_string(logits.cols()) + ")");
  for (std::size_t r = 0; r < n; ++r) {
    const double weight = weights.empty() ? 1.0 : static_cast<double>(weights[r]);
    out.loss += host[r] * (weight * inv_divisor);
    out.loss_sum += host[r] * weight;
    out.samples += weight;
    if (weight > 0) out.correct += static_cast<std::size_t>(host_correct[r]);
  }
  return out;
}

}  // namespace detail

inline cross_entropy_result softmax_cross_entropy(const matrix& logits,
                                                  const ddp::cuda::device_vector<std::int32_t>& labels) {
  return detail::softmax_cross_entropy(logits, labels, {}, static_cast<double>(logits.rows() ? logits.rows() : 1));
}

inline cross_entropy_result softmax_cross_entropy(const matrix& logits,
                                                  const ddp::cuda::device_vector<std::int32_t>& labels,
                                                  const sample_weights& weights) {
  return detail::softmax_cross_entropy(logits, labels, weights.per_sample, weights.divisor());
}

// The mean loss's gradient alone, with nothing read on the host, so that a step captured into a
// CUDA graph (ddp::cuda::step_graph) can end with it. Each row's loss goes to `row_loss` when
// given (logits.rows() doubles of device memory the caller keeps, and reads after the step).
// Labels outside the classes are not reported here: check them when the data is loaded.
inline matrix softmax_cross_entropy_gradient(const matrix& logits,
                                             const ddp::cuda::device_vector<std::int32_t>& labels,
                                             double* row_loss = nullptr) {
  const std::size_t n = logits.rows();
  const double divisor = static_cast<double>(n ? n : 1);
  ddp::nn::detail::check_cross_entropy_arguments("ddp::nn::cuda::softmax_cross_entropy_gradient", n, labels.size(), 0,
                                                divisor);
  auto& dev = logits.device();
  matrix grad(dev, n, logits.cols());
  ddp::cuda::device_vector<double> losses(dev, row_loss ? 0 : n);
  ddp::cuda::device_vector<std::int32_t> flags(dev, n + 1);  // correct per row, then the first bad label
  ddp::cuda::check(kernels::softmax_cross_entropy(logits.data(), labels.data(), nullptr, 1.0 / divisor, n,
                                                  logits.cols(), grad.data(), row_loss ? row_loss : losses.data(),
                                                  flags.data(), flags.data() + n, dev.stream()),
                   "softmax_cross_entropy kernel", dev.site());
  return grad;
}

}  // namespace ddp::nn::cuda
