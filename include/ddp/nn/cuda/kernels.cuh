#pragma once
// Definitions of ddp/nn/cuda/kernels.hpp; compile in exactly one nvcc translation unit.
// These serve small layers (features in the hundreds, batches in the tens to thousands): one
// thread per feature column walks the rows, so neighbouring threads read neighbouring floats.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "ddp/nn/cuda/kernels.hpp"

namespace ddp::nn::cuda::kernels {

namespace device_code {

constexpr unsigned threads = 256;

inline unsigned blocks(std::size_t n) {
  const std::size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535 * 16 ? (b ? b : 1) : 65535 * 16);
}

__device__ __forceinline__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

__global__ void fill_rows_kernel(float* y, const float* row, std::size_t rows, std::size_t cols) {
  for (std::size_t i = first_index(); i < rows * cols; i += stride()) y[i] = row[i % cols];
}

__global__ void add_column_sums_kernel(float* out, const float* x, std::size_t rows, std::size_t cols) {
  for (std::size_t c = first_index(); c < cols; c += stride()) {
    float s = out[c];
    for (std::size_t r = 0; r < rows; ++r) s += x[r * cols + c];
    out[c] = s;
  }
}

__global__ void relu_forward_kernel(const float* x, float* y, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += stride()) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += stride()) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

__global__ void add_into_bf16_kernel(__nv_bfloat16* h, float* acc, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += stride()) {
    h[i] = __float2bfloat16_rn(__bfloat162float(h[i]) + acc[i]);
    acc[i] = 0.0f;
  }
}
__global__ void add_into_f16_kernel(__half* h, float* acc, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += stride()) {
    h[i] = __float2half_rn(__half2float(h[i]) + acc[i]);
    acc[i] = 0.0f;
  }
}

// One thread adds: the launch has a block of threads, and every one of them adding would add v
// once per thread.
__global__ void add_i64_kernel(std::int64_t* x, std::int64_t v) {
  if (first_index() == 0) *x += v;
}

__global__ void column_moments_kernel(const float* x, std::size_t rows, std::size_t cols, double* m) {
  if (first_index() == 0) m[2 * cols] = static_cast<double>(rows);
  for (std::size_t c = first_index(); c < cols; c += stride()) {
    double s = 0.0, sq = 0.0;
    for (std::size_t r = 0; r < rows; ++r) {
      const float v = x[r * cols + c];
      s += v;
      sq += static_cast<double>(v) * v;
    }
    m[c] = s;
    m[cols + c] = sq;
  }
}

__global__ void batch_statistics_kernel(const double* m, std::size_t f, float momentum, float eps, float* mean,
                                        float* inv_std, float* rm, float* rv) {
  const double count = m[2 * f];
  for (std::size_t c = first_index(); c < f; c += stride()) {
    const double mu = m[c] / count;
    const double var = fmax(0.0, m[f + c] / count - mu * mu);
    mean[c] = static_cast<float>(mu);
    inv_std[c] = static_cast<float>(1.0 / sqrt(var + eps));
    rm[c] = (1.0f - momentum) * rm[c] + momentum * mean[c];
    rv[c] = (1.0f - momentum) * rv[c] + momentum * static_cast<float>(var * count / (count - 1));
  }
}

__global__ void running_statistics_kernel(const float* rm, const float* rv, std::size_t f, float eps, float* mean,
                                          float* inv_std) {
  for (std::size_t c = first_index(); c < f; c += stride()) {
    mean[c] = rm[c];
    inv_std[c] = 1.0f / sqrtf(rv[c] + eps);
  }
}

__global__ void normalize_kernel(const float* x, const float* mean, const float* inv_std, const float* g,
                                 const float* b, float* xhat, float* y, std::size_t rows, std::size_t cols) {
  for (std::size_t i = first_index(); i < rows * cols; i += stride()) {
    const std::size_t c = i % cols;
    const float h = (x[i] - mean[c]) * inv_std[c];
    xhat[i] = h;
    y[i] = h * g[c] + b[c];
  }
}

__global__ void normalize_backward_sums_kernel(const float* dy, const float* xhat, std::size_t rows, std::size_t cols,
                                               double* sums, float* dg, float* db) {
  for (std::size_t c = first_index(); c < cols; c += stride()) {
    double s = 0.0, sh = 0.0;
    for (std::size_t r = 0; r < rows; ++r) {
      const float d = dy[r * cols + c];
      s += d;
      sh += static_cast<double>(d) * xhat[r * cols + c];
    }
    sums[c] = s;
    sums[cols + c] = sh;
    dg[c] += static_cast<float>(sh);
    db[c] += static_cast<float>(s);
  }
}

__global__ void normalize_backward_input_kernel(const float* dy, const float* xhat, const float* g,
                                                const float* inv_std, const double* sums, const double* count_on_device,
                                                bool batch_stats, float* dx, std::size_t rows, std::size_t cols) {
  const double count = batch_stats ? *count_on_device : 0.0;
  for (std::size_t i = first_index(); i < rows * cols; i += stride()) {
    const std::size_t c = i % cols;
    if (batch_stats) {
      const double mean_dy = sums[c] / count;
      const double mean_dy_xhat = sums[cols + c] / count;
      dx[i] = static_cast<float>(g[c] * inv_std[c] * (dy[i] - mean_dy - xhat[i] * mean_dy_xhat));
    } else {
      dx[i] = dy[i] * g[c] * inv_std[c];
    }
  }
}

__global__ void softmax_cross_entropy_kernel(const float* logits, const std::int32_t* labels, const float* weight,
                                             double inv_divisor, std::size_t rows, std::size_t cols, float* grad,
                                             double* loss, std::int32_t* correct, std::int32_t* bad_label) {
  for (std::size_t r = first_index(); r < rows; r += stride()) {
    const float* z = logits + r * cols;
    const std::int32_t label = labels[r];
    if (label < 0 || static_cast<std::size_t>(label) >= cols) {
      atomicCAS(bad_label, -1, label);
      loss[r] = 0.0;
      correct[r] = 0;
      continue;
    }
    std::size_t best = 0;
    for (std::size_t c = 1; c < cols; ++c)
      if (z[c] > z[best]) best = c;
    const float zmax = z[best];
    double sum = 0.0;
    for (std::size_t c = 0; c < cols; ++c) sum += exp(static_cast<double>(z[c] - zmax));
    const double log_sum = log(sum);
    loss[r] = log_sum - static_cast<double>(z[label] - zmax);
    const double scale = (weight ? static_cast<double>(weight[r]) : 1.0) * inv_divisor;
    for (std::size_t c = 0; c < cols; ++c)
      grad[r * cols + c] =
          static_cast<float>((exp(static_cast<double>(z[c] - zmax) - log_sum) - (c == static_cast<std::size_t>(label))) * scale);
    correct[r] = best == static_cast<std::size_t>(label);
  }
}

__global__ void add_kernel(float* y, const float* x, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += stride()) y[i] += x[i];
}

__global__ void layer_norm_forward_kernel(const float* x, const float* g, const float* b, float eps, float* xhat,
                                          float* y, float* inv_std, std::size_t rows, std::size_t cols) {
  for (std::size_t r = first_index(); r < rows; r += stride()) {
    const float* xr = x + r * cols;
    double sum = 0.0, sq = 0.0;
    for (std::size_t c = 0; c < cols; ++c) sum += xr[c];
    const double mean = sum / static_cast<double>(cols);
    for (std::size_t c = 0; c < cols; ++c) sq += (xr[c] - mean) * (xr[c] - mean);
    const double is = 1.0 / sqrt(sq / static_cast<double>(cols) + eps);
    inv_std[r] = static_cast<float>(is);
    for (std::size_t c = 0; c < cols; ++c) {
      const float h = static_cast<float>((xr[c] - mean) * is);
      xhat[r * cols + c] = h;
      y[r * cols + c] = h * g[c] + b[c];
    }
  }
}

__global__ void layer_norm_backward_input_kernel(const float* dy, const float* xhat, const float* g,
                                                 const float* inv_std, float* dx, std::size_t rows, std::size_t cols) {
  for (std::size_t r = first_index(); r < rows; r += stride()) {
    double mean_dh = 0.0, mean_dh_xhat = 0.0;
    for (std::size_t c = 0; c < cols; ++c) {
      const double dh = static_cast<double>(dy[r * cols + c]) * g[c];
      mean_dh += dh;
      mean_dh_xhat += dh * xhat[r * cols + c];
    }
    mean_dh /= static_cast<double>(cols);
    mean_dh_xhat /= static_cast<double>(cols);
    for (std::size_t c = 0; c < cols; ++c) {
      const double dh = static_cast<double>(dy[r * cols + c]) * g[c];
      dx[r * cols + c] = static_cast<float>(inv_std[r] * (dh - mean_dh - xhat[r * cols + c] * mean_dh_xhat));
    }
  }
}

__global__ void gelu_forward_kernel(const float* x, float* y, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += stride())
    y[i] = static_cast<float>(0.5 * x[i] * (1.0 + erf(x[i] * 0.70710678118654752440)));
}

__global__ void gelu_backward_kernel(const float* x, const float* dy, float* dx, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += stride()) {
    const double cdf = 0.5 * (1.0 + erf(x[i] * 0.70710678118654752440));
    const double pdf = 0.39894228040143267794 * exp(-0.5 * static_cast<double>(x[i]) * x[i]);
    dx[i] = dy[i] * static_cast<float>(cdf + x[i] * pdf);
  }
}

__global__ void embedding_forward_kernel(const float* w, const std::int32_t* indices, float* y, std::size_t rows,
                                         std::size_t dim) {
  for (std::size_t i = first_index(); i < rows * dim; i += stride())
    y[i] = w[static_cast<std::size_t>(indices[i / dim]) * dim + i % dim];
}

__global__ void embedding_backward_kernel(float* grad, const std::int32_t* indices, const float* dy, std::size_t rows,
                                          std::size_t dim) {
  for (std::size_t c = first_index(); c < dim; c += stride())
    for (std::size_t r = 0; r < rows; ++r) grad[static_cast<std::size_t>(indices[r]) * dim + c] += dy[r * dim + c];
}

// One warp per row of the attention's scores: lanes stride the columns, shuffles reduce.
constexpr unsigned warp = 32;

__device__ __forceinline__ float warp_max(float v) {
  for (unsigned o = warp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (unsigned o = warp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void attention_softmax_kernel(const float* s, float* p, std::size_t total_rows, std::size_t rows,
                                         std::size_t cols, float scale, bool causal) {
  const unsigned lane = threadIdx.x % warp;
  const std::size_t warps = stride() / warp;
  for (std::size_t r = first_index() / warp; r < total_rows; r += warps) {
    const std::size_t i = r % rows, kept = causal && i + 1 < cols ? i + 1 : cols;
    const float* sr = s + r * cols;
    float* pr = p + r * cols;
    float top = -INFINITY;
    for (std::size_t j = lane; j < kept; j += warp) top = fmaxf(top, scale * sr[j]);
    top = warp_max(top);
    float sum = 0.0f;
    for (std::size_t j = lane; j < kept; j += warp) sum += expf(scale * sr[j] - top);
    const float inverse = 1.0f / warp_sum(sum);
    for (std::size_t j = lane; j < cols; j += warp) pr[j] = j < kept ? expf(scale * sr[j] - top) * inverse : 0.0f;
  }
}

__global__ void attention_softmax_backward_kernel(const float* p, const float* dp, float* ds, std::size_t total_rows,
                                                  std::size_t rows, std::size_t cols, float scale, bool causal) {
  const unsigned lane = threadIdx.x % warp;
  const std::size_t warps = stride() / warp;
  for (std::size_t r = first_index() / warp; r < total_rows; r += warps) {
    const std::size_t i = r % rows, kept = causal && i + 1 < cols ? i + 1 : cols, at = r * cols;
    float dot = 0.0f;
    for (std::size_t j = lane; j < kept; j += warp) dot += p[at + j] * dp[at + j];
    dot = warp_sum(dot);
    for (std::size_t j = lane; j < cols; j += warp)
      ds[at + j] = j < kept ? scale * (p[at + j] * (dp[at + j] - dot)) : 0.0f;
  }
}

// Element i of a [sequences, heads, length, head_dim] array, as its place in rows of `row_cols`
// floats (b*length + t), the heads side by side from column `offset`.
__device__ __forceinline__ std::size_t row_place(std::size_t i, std::size_t row_cols, std::size_t offset, std::size_t length,
                                        std::size_t heads, std::size_t head_dim) {
  const std::size_t d = i % head_dim, t = i / head_dim % length, h = i / (head_dim * length) % heads,
                    b = i / (head_dim * length * heads);
  return (b * length + t) * row_cols + offset + h * head_dim + d;
}

__global__ void heads_from_rows_kernel(const float* x, std::size_t row_cols, std::size_t offset, float* y,
                                       std::size_t sequences, std::size_t length, std::size_t heads,
                                       std::size_t head_dim) {
  const std::size_t n = sequences * heads * length * head_dim;
  for (std::size_t i = first_index(); i < n; i += stride())
    y[i] = x[row_place(i, row_cols, offset, length, heads, head_dim)];
}

__global__ void rows_from_heads_kernel(const float* y, float* x, std::size_t row_cols, std::size_t offset,
                                       std::size_t sequences, std::size_t length, std::size_t heads,
                                       std::size_t head_dim) {
  const std::size_t n = sequences * heads * length * head_dim;
  for (std::size_t i = first_index(); i < n; i += stride())
    x[row_place(i, row_cols, offset, length, heads, head_dim)] = y[i];
}

__global__ void position_forward_kernel(const float* x, const float* w, float* y, std::size_t rows,
                                        std::size_t length, std::size_t width) {
  for (std::size_t i = first_index(); i < rows * width; i += stride())
    y[i] = x[i] + w[(i / width) % length * width + i % width];
}

__global__ void position_backward_kernel(float* grad, const float* dy, std::size_t rows, std::size_t length,
                                         std::size_t width) {
  for (std::size_t i = first_index(); i < length * width; i += stride()) {
    float g = grad[i];
    for (std::size_t r = i / width; r < rows; r += length) g += dy[r * width + i % width];
    grad[i] = g;
  }
}

}  // namespace device_code

#define DDP_NN_LAUNCH(n, kernel, ...)                                                       \
  do {                                                                                      \
    if ((n) == 0) return cudaSuccess;                                                       \
    device_code::kernel<<<device_code::blocks(n), device_code::threads, 0, stream>>>(__VA_ARGS__); \
    return cudaGetLastError();                                                              \
  } while (0)

cudaError_t fill_rows(float* y, const float* row, std::size_t rows, std::size_t cols, cudaStream_t stream) {
  DDP_NN_LAUNCH(rows * cols, fill_rows_kernel, y, row, rows, cols);
}
cudaError_t add_column_sums(float* out, const float* x, std::size_t rows, std::size_t cols, cudaStream_t stream) {
  DDP_NN_LAUNCH(cols, add_column_sums_kernel, out, x, rows, cols);
}
cudaError_t relu_forward(const float* x, float* y, std::size_t n, cudaStream_t stream) {
  DDP_NN_LAUNCH(n, relu_forward_kernel, x, y, n);
}
cudaError_t relu_backward(const float* y, const float* dy, float* dx, std::size_t n, cudaStream_t stream) {
  DDP_NN_LAUNCH(n, relu_backward_kernel, y, dy, dx, n);
}
cudaError_t add_into_half(void* half, bool bf16, float* acc, std::size_t n, cudaStream_t stream) {
  if (bf16) DDP_NN_LAUNCH(n, add_into_bf16_kernel, static_cast<__nv_bfloat16*>(half), acc, n);
  DDP_NN_LAUNCH(n, add_into_f16_kernel, static_cast<__half*>(half), acc, n);
}
cudaError_t add_i64(std::int64_t* x, std::int64_t v, cudaStream_t stream) { DDP_NN_LAUNCH(1, add_i64_kernel, x, v); }
cudaError_t column_moments(const float* x, std::size_t rows, std::size_t cols, double* moments, cudaStream_t stream) {
  DDP_NN_LAUNCH(cols, column_moments_kernel, x, rows, cols, moments);
}
cudaError_t batch_statistics(const double* moments, std::size_t features, float momentum, float eps, float* mean,
                             float* inv_std, float* running_mean, float* running_var, cudaStream_t stream) {
  DDP_NN_LAUNCH(features, batch_statistics_kernel, moments, features, momentum, eps, mean, inv_std, running_mean,
                running_var);
}
cudaError_t running_statistics(const float* running_mean, const float* running_var, std::size_t features, float eps,
                               float* mean, float* inv_std, cudaStream_t stream) {
  DDP_NN_LAUNCH(features, running_statistics_kernel, running_mean, running_var, features, eps, mean, inv_std);
}
cudaError_t normalize(const float* x, const float* mean, const float* inv_std, const float* gamma, const float* beta,
                      float* xhat, float* y, std::size_t rows, std::size_t cols, cudaStream_t stream) {
  DDP_NN_LAUNCH(rows * cols, normalize_kernel, x, mean, inv_std, gamma, beta, xhat, y, rows, cols);
}
cudaError_t normalize_backward_sums(const float* dy, const float* xhat, std::size_t rows, std::size_t cols,
                                   double* sums, float* dgamma, float* dbeta, cudaStream_t stream) {
  DDP_NN_LAUNCH(cols, normalize_backward_sums_kernel, dy, xhat, rows, cols, sums, dgamma, dbeta);
}
cudaError_t normalize_backward_input(const float* dy, const float* xhat, const float* gamma, const float* inv_std,
                                     const double* sums, const double* count, bool batch_stats, float* dx,
                                     std::size_t rows, std::size_t cols, cudaStream_t stream) {
  DDP_NN_LAUNCH(rows * cols, normalize_backward_input_kernel, dy, xhat, gamma, inv_std, sums, count, batch_stats, dx,
                rows, cols);
}
cudaError_t softmax_cross_entropy(const float* logits, const std::int32_t* labels, const float* weight,
                                  double inv_divisor, std::size_t rows, std::size_t cols, float* grad, double* loss,
                                  std::int32_t* correct, std::int32_t* bad_label, cudaStream_t stream) {
  DDP_NN_LAUNCH(rows, softmax_cross_entropy_kernel, logits, labels, weight, inv_divisor, rows, cols, grad, loss,
                correct, bad_label);
}

cudaError_t add(float* y, const float* x, std::size_t n, cudaStream_t stream) { DDP_NN_LAUNCH(n, add_kernel, y, x, n); }
cudaError_t layer_norm_forward(const float* x, const float* gamma, const float* beta, float eps, float* xhat, float* y,
                               float* inv_std, std::size_t rows, std::size_t cols, cudaStream_t stream) {
  DDP_NN_LAUNCH(rows, layer_norm_forward_kernel, x, gamma, beta, eps, xhat, y, inv_std, rows, cols);
}
cudaError_t layer_norm_backward_input(const float* dy, const float* xhat, const float* gamma, const float* inv_std,
                                      float* dx, std::size_t rows, std::size_t cols, cudaStream_t stream) {
  DDP_NN_LAUNCH(rows, layer_norm_backward_input_kernel, dy, xhat, gamma, inv_std, dx, rows, cols);
}
cudaError_t gelu_forward(const float* x, float* y, std::size_t n, cudaStream_t stream) {
  DDP_NN_LAUNCH(n, gelu_forward_kernel, x, y, n);
}
cudaError_t gelu_backward(const float* x, const float* dy, float* dx, std::size_t n, cudaStream_t stream) {
  DDP_NN_LAUNCH(n, gelu_backward_kernel, x, dy, dx, n);
}
cudaError_t embedding_forward(const float* weight, const std::int32_t* indices, float* y, std::size_t rows,
                              std::size_t dim, cudaStream_t stream) {
  DDP_NN_LAUNCH(rows * dim, embedding_forward_kernel, weight, indices, y, rows, dim);
}
cudaError_t embedding_backward(float* grad, const std::int32_t* indices, const float* dy, std::size_t rows,
                               std::size_t dim, cudaStream_t stream) {
  DDP_NN_LAUNCH(dim, embedding_backward_kernel, grad, indices, dy, rows, dim);
}

cudaError_t attention_softmax(const float* scores, float* probs, std::size_t matrices, std::size_t rows,
                              std::size_t cols, float scale, bool causal, cudaStream_t stream) {
  DDP_NN_LAUNCH(matrices * rows * cols == 0 ? 0 : matrices * rows * device_code::warp, attention_softmax_kernel, scores,
                probs, matrices * rows, rows, cols, scale, causal);
}
cudaError_t attention_softmax_backward(const float* probs, const float* dprobs, float* dscores, std::size_t matrices,
                                       std::size_t rows, std::size_t cols, float scale, bool causal,
                                       cudaStream_t stream) {
  DDP_NN_LAUNCH(matrices * rows * cols == 0 ? 0 : matrices * rows * device_code::warp,
                attention_softmax_backward_kernel, probs, dprobs, dscores, matrices * rows, rows, cols, scale, causal);
}
cudaError_t heads_from_rows(const float* rows, std::size_t row_cols, std::size_t offset, float* heads,
                            std::size_t sequences, std::size_t length, std::size_t heads_count, std::size_t head_dim,
                            cudaStream_t stream) {
  DDP_NN_LAUNCH(sequences * length * heads_count * head_dim, heads_from_rows_kernel, rows, row_cols, offset, heads,
                sequences, length, heads_count, head_dim);
}
cudaError_t rows_from_heads(const float* heads, float* rows, std::size_t row_cols, std::size_t offset,
                            std::size_t sequences, std::size_t length, std::size_t heads_count, std::size_t head_dim,
                            cudaStream_t stream) {
  DDP_NN_LAUNCH(sequences * length * heads_count * head_dim, rows_from_heads_kernel, heads, rows, row_cols, offset,
                sequences, length, heads_count, head_dim);
}

cudaError_t position_forward(const float* x, const float* weight, float* y, std::size_t rows, std::size_t length,
                             std::size_t width, cudaStream_t stream) {
  DDP_NN_LAUNCH(rows * width, position_forward_kernel, x, weight, y, rows, length, width);
}
cudaError_t position_backward(float* grad, const float* dy, std::size_t rows, std::size_t length, std::size_t width,
                              cudaStream_t stream) {
  DDP_NN_LAUNCH(length * width, position_backward_kernel, grad, dy, rows, length, width);
}

#undef DDP_NN_LAUNCH

}  // namespace ddp::nn::cuda::kernels
