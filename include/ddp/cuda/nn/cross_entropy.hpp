#pragma once
// Softmax cross-entropy of GPU logits: the mean loss and the correct count come back to the
// host (one small copy per batch), the gradient stays on the GPU.
#include <cstdint>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>

#include "ddp/cuda/nn/kernels.hpp"
#include "ddp/cuda/nn/matrix.hpp"

namespace ddp::cuda::nn {

struct cross_entropy_result {
  double loss = 0.0;  // mean over the batch
  matrix grad;        // d loss / d logits
  std::size_t correct = 0;
};

inline cross_entropy_result softmax_cross_entropy(const matrix& logits, const device_vector<std::int32_t>& labels) {
  if (labels.size() != logits.rows())
    throw std::invalid_argument("ddp::cuda::nn::softmax_cross_entropy: " + std::to_string(logits.rows()) +
                                " rows of logits but " + std::to_string(labels.size()) + " labels");
  auto& dev = logits.device();
  const std::size_t n = logits.rows();
  cross_entropy_result out{0.0, matrix(dev, n, logits.cols()), 0};
  // One allocation for the per-row results, so one copy brings them back: loss (double), then
  // correct flags, then the first bad label (int32).
  const std::size_t words = n + (n + 2) / 2 + 1;
  device_vector<double> scratch(dev, words);
  auto* row_loss = scratch.data();
  auto* correct = reinterpret_cast<std::int32_t*>(scratch.data() + n);
  auto* bad = correct + n;
  const std::int32_t none = -1;
  dev.copy_from_host(bad, &none, sizeof none);
  check(kernels::softmax_cross_entropy(logits.data(), labels.data(), n, logits.cols(), out.grad.data(), row_loss,
                                       correct, bad, dev.stream()),
        "softmax_cross_entropy kernel", dev.site());
  const auto host = scratch.to_host();
  const auto* host_correct = reinterpret_cast<const std::int32_t*>(host.data() + n);
  if (const std::int32_t b = host_correct[n]; b != -1)
    throw std::invalid_argument("ddp::cuda::nn::softmax_cross_entropy: label " + std::to_string(b) + " outside [0, " +
                                std::to_string(logits.cols()) + ")");
  for (std::size_t r = 0; r < n; ++r) {
    out.loss += host[r];
    out.correct += static_cast<std::size_t>(host_correct[r]);
  }
  return out;
}

}  // namespace ddp::cuda::nn
