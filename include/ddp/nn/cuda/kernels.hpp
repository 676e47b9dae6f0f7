#pragma once
// Kernels of the CUDA reference layers (ddp/nn/cuda), as host functions that enqueue them.
// Defined in ddp/nn/cuda/kernels.cuh (one nvcc translation unit, src/cuda/kernels.cu). Matrices
// are row-major, rows = samples; each returns the launch status.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ddp::nn::cuda::kernels {

// y[r, :] = row, for every r
cudaError_t fill_rows(float* y, const float* row, std::size_t rows, std::size_t cols, cudaStream_t);
// out[c] += sum over r of x[r, c]
cudaError_t add_column_sums(float* out, const float* x, std::size_t rows, std::size_t cols, cudaStream_t);
cudaError_t relu_forward(const float* x, float* y, std::size_t n, cudaStream_t);
// dx = y > 0 ? dy : 0
cudaError_t relu_backward(const float* y, const float* dy, float* dx, std::size_t n, cudaStream_t);

// A 16-bit parameter's gradient: half[i] = round(half[i] + acc[i]) (bf16 when `bf16`, else
// f16; to nearest even), then acc[i] = 0.
cudaError_t add_into_half(void* half, bool bf16, float* acc, std::size_t n, cudaStream_t);

// *x += v (a device-side counter)
cudaError_t add_i64(std::int64_t* x, std::int64_t v, cudaStream_t);

// batch_norm, with the host layer's arithmetic (ddp/nn/batch_norm.hpp): sums in double, kept
// on the device (2 * cols + 1 of them) so that a communicator can sum them over ranks in place.
// moments[c] = sum of x[:, c], moments[cols + c] = sum of x[:, c]^2, moments[2 * cols] = rows
cudaError_t column_moments(const float* x, std::size_t rows, std::size_t cols, double* moments, cudaStream_t);
// From (global) moments, their sample count included: mean, 1/sqrt(var + eps), and the running
// statistics.
cudaError_t batch_statistics(const double* moments, std::size_t features, float momentum, float eps, float* mean,
                             float* inv_std, float* running_mean, float* running_var, cudaStream_t);
cudaError_t running_statistics(const float* running_mean, const float* running_var, std::size_t features, float eps,
                               float* mean, float* inv_std, cudaStream_t);
// xhat = (x - mean) * inv_std; y = xhat * gamma + beta
cudaError_t normalize(const float* x, const float* mean, const float* inv_std, const float* gamma, const float* beta,
                      float* xhat, float* y, std::size_t rows, std::size_t cols, cudaStream_t);
// sums[c] = sum dy, sums[cols + c] = sum dy * xhat; dgamma += the latter, dbeta += the former
cudaError_t normalize_backward_sums(const float* dy, const float* xhat, std::size_t rows, std::size_t cols,
                                   double* sums, float* dgamma, float* dbeta, cudaStream_t);
// dx of batch statistics over *count samples (device memory; batch_stats), or of fixed
// statistics (count unused)
cudaError_t normalize_backward_input(const float* dy, const float* xhat, const float* gamma, const float* inv_std,
                                     const double* sums, const double* count, bool batch_stats, float* dx,
                                     std::size_t rows, std::size_t cols, cudaStream_t);

// Softmax cross-entropy per row: loss[r] (the row's own loss), grad of the sum over rows of
// weight[r] * loss[r] * inv_divisor (weight null: every row weighs 1), correct[r] = argmax is
// the label; *bad_label = a row's label outside [0, cols), else -1 stays.
cudaError_t softmax_cross_entropy(const float* logits, const std::int32_t* labels, const float* weight,
                                  double inv_divisor, std::size_t rows, std::size_t cols, float* grad, double* loss,
                                  std::int32_t* correct, std::int32_t* bad_label, cudaStream_t);

// y += x, elementwise (a residual's skip path)
cudaError_t add(float* y, const float* x, std::size_t n, cudaStream_t);

// layer_norm, with the host layer's arithmetic (ddp/nn/layer_norm.hpp), one thread per row: the
// row's mean and biased variance in double; inv_std[r] = 1/sqrt(var + eps), xhat = (x - mean) * inv_std,
// y = xhat * gamma + beta
cudaError_t layer_norm_forward(const float* x, const float* gamma, const float* beta, float eps, float* xhat, float* y,
                               float* inv_std, std::size_t rows, std::size_t cols, cudaStream_t);
// dx = inv_std * (dh - mean(dh) - xhat * mean(dh * xhat)) per row, dh = dy * gamma
cudaError_t layer_norm_backward_input(const float* dy, const float* xhat, const float* gamma, const float* inv_std,
                                      float* dx, std::size_t rows, std::size_t cols, cudaStream_t);

// The exact (erf) GELU and dx = dy * (Phi(x) + x * phi(x)), in double as the host layer
cudaError_t gelu_forward(const float* x, float* y, std::size_t n, cudaStream_t);
cudaError_t gelu_backward(const float* x, const float* dy, float* dx, std::size_t n, cudaStream_t);

// y[r, :] = weight[indices[r], :] (indices checked on the host)
cudaError_t embedding_forward(const float* weight, const std::int32_t* indices, float* y, std::size_t rows,
                              std::size_t dim, cudaStream_t);
// grad[indices[r], :] += dy[r, :] for r in order: one thread per feature walks the rows, so
// repeated indices sum in the host's order, without atomics
cudaError_t embedding_backward(float* grad, const std::int32_t* indices, const float* dy, std::size_t rows,
                               std::size_t dim, cudaStream_t);

// Multi-head attention (ddp/nn/cuda/attention.hpp). Its scores and probabilities are `matrices`
// row-major rows x cols matrices, one after another (one per sequence and head).
// probs = softmax of scale * scores over each row, in f32: the row's maximum taken out before
// exp. causal: row i keeps columns 0..i, and the columns past i are exactly +0. One warp per row;
// probs may be scores (in place), and dscores dprobs below.
cudaError_t attention_softmax(const float* scores, float* probs, std::size_t matrices, std::size_t rows,
                              std::size_t cols, float scale, bool causal, cudaStream_t);
// Its backward: dscores = scale * p * (dp - sum over the row of p * dp); the masked columns
// exactly +0.
cudaError_t attention_softmax_backward(const float* probs, const float* dprobs, float* dscores, std::size_t matrices,
                                       std::size_t rows, std::size_t cols, float scale, bool causal, cudaStream_t);
// The heads of a batch of sequences. rows: (sequences * length) rows of `row_cols` floats, row
// b * length + t; head h of it is the `head_dim` columns from offset + h * head_dim. heads:
// [sequences, heads, length, head_dim], one row-major length x head_dim matrix per sequence and head.
// heads[b, h, t, :] = rows[b * length + t, offset + h * head_dim ...]
cudaError_t heads_from_rows(const float* rows, std::size_t row_cols, std::size_t offset, float* heads,
                            std::size_t sequences, std::size_t length, std::size_t heads_count, std::size_t head_dim,
                            cudaStream_t);
// The inverse: rows[b * length + t, offset + h * head_dim ...] = heads[b, h, t, :]; the other
// columns of rows are left as they are.
cudaError_t rows_from_heads(const float* heads, float* rows, std::size_t row_cols, std::size_t offset,
                            std::size_t sequences, std::size_t length, std::size_t heads_count, std::size_t head_dim,
                            cudaStream_t);

// A learned position embedding (ddp/nn/cuda/position_embedding.hpp): rows are sequences of
// `length` positions, row r at position r % length. y[r, :] = x[r, :] + weight[r % length, :]
cudaError_t position_forward(const float* x, const float* weight, float* y, std::size_t rows, std::size_t length,
                             std::size_t width, cudaStream_t);
// grad[t, :] += dy[r, :] for the rows r at position t, in row order: one thread per element of
// the table walks its rows, so the sums are the host's, bit for bit
cudaError_t position_backward(float* grad, const float* dy, std::size_t rows, std::size_t length, std::size_t width,
                              cudaStream_t);

}  // namespace ddp::nn::cuda::kernels
