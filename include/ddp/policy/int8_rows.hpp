#pragma once
// comm_hook::int8_rows: 8 bits per element with an f32 scale per row.
//
// Each rank cuts the bucket into rows (a matrix parameter's rows, as tensor_layout gives them; a
// vector parameter, and the padding after the last parameter, one row each), and sends, per row,
// s = max |x| / 127 and each element as round(x / s) in [-127, 127]. The ranks all-gather those
// bytes; each rank then sums every rank's rows back in f32, in rank order, and divides by the
// world size, so every rank holds the same bits.
//
// Error: rounding moves an element by at most s / 2 = max |row| / 254 of its own rank's row, so
// the average is off by at most the mean over the ranks of max |row| / 254 (plus f32 rounding of
// the sum: (N + 1) 2^-24 relative). Bytes: 1 per element and 4 per row, gathered: each rank
// receives those of the N - 1 others, (N - 1) (n + 4 R) bytes against an f32 all_reduce's
// 2 (N - 1) / N 4 n: a quarter of them at 2 ranks, and the same at 8. Past that an all_gather moves
// more than a reduction would; use bf16 or powersgd for large worlds.
//
// The quantisation runs on the host (the device's gradients are copied there and back), so on a
// GPU it costs two host round trips per bucket and cannot be captured into a CUDA graph.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

#include "ddp/core/buffer.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/policy/comm_hook.hpp"

namespace ddp::policy::comm_hook {

struct int8_rows {
  using slot = comm_hook::slot;
  static constexpr std::string_view name = "int8_rows";

  struct row {
    std::size_t begin = 0, count = 0;
  };

  // The rows of a bucket of `size` floats holding `tensors`, in bucket order.
  static std::vector<row> rows_of(std::span<const tensor_layout> tensors, std::size_t size) {
    std::vector<row> rows;
    std::size_t end = 0;
    for (const auto& t : tensors) {
      if (t.cols <= 1) {
        rows.push_back({t.offset, t.rows * std::max<std::size_t>(t.cols, 1)});
      } else {
        for (std::size_t r = 0; r < t.rows; ++r) rows.push_back({t.offset + r * t.cols, t.cols});
      }
      end = std::max(end, t.offset + t.rows * std::max<std::size_t>(t.cols, 1));
    }
    if (end < size) rows.push_back({end, size - end});
    return rows;
  }
  // One rank's message: the rows' scales (f32), then one signed byte per element; rounded up
  // to whole floats.
  static std::size_t message_bytes(std::size_t rows, std::size_t size) {
    return (rows * sizeof(float) + size + sizeof(float) - 1) / sizeof(float) * sizeof(float);
  }
  // A row holding a NaN or an infinity travels as a NaN scale, so the average is NaN there, as
  // an f32 reduction's would be.
  static void quantize(const float* x, std::span<const row> rows, std::uint8_t* message) {
    auto* q = reinterpret_cast<std::int8_t*>(message + rows.size() * sizeof(float));
    for (std::size_t k = 0; k < rows.size(); ++k) {
      const auto [begin, count] = rows[k];
      float largest = 0.0f;
      bool finite = true;
      for (std::size_t i = begin; i < begin + count; ++i) {
        finite = finite && std::isfinite(x[i]);
        largest = std::max(largest, std::fabs(x[i]));
      }
      const float s = finite ? largest / 127.0f : std::numeric_limits<float>::quiet_NaN();
      std::memcpy(message + k * sizeof(float), &s, sizeof(float));
      for (std::size_t i = begin; i < begin + count; ++i)
        q[i] = finite && s > 0.0f ? static_cast<std::int8_t>(std::clamp(std::nearbyint(x[i] / s), -127.0f, 127.0f)) : 0;
    }
  }
  // out = the mean over `ranks` messages, summed in rank order.
  static void average(const std::uint8_t* messages, std::size_t bytes, int ranks, std::span<const row> rows, float* out,
                      std::size_t size) {
    std::fill(out, out + size, 0.0f);
    for (int r = 0; r < ranks; ++r) {
      const std::uint8_t* m = messages + static_cast<std::size_t>(r) * bytes;
      const auto* q = reinterpret_cast<const std::int8_t*>(m + rows.size() * sizeof(float));
      for (std::size_t k = 0; k < rows.size(); ++k) {
        float scale;
        std::memcpy(&scale, m + k * sizeof(float), sizeof(float));
        for (std::size_t i = rows[k].begin; i < rows[k].begin + rows[k].count; ++i)
          out[i] += static_cast<float>(q[i]) * scale;
      }
    }
    const float n = static_cast<float>(ranks);
    for (std::size_t i = 0; i < size; ++i) out[i] /= n;
  }

  // Each bucket's rows and message size follow from its layout: reduce and finish compute them
  // alike (the trainer starts every bucket before it finishes the first).
  template <class IO>
  void reduce(IO& b) {
    auto& dev = b.device();
    const std::size_t n = b.size();
    const auto rows = rows_of(b.tensors(), n);
    const std::size_t bytes = message_bytes(rows.size(), n);
    std::vector<float> x(n);
    dev.copy_to_host(x.data(), b.gradients(), n * sizeof(float));
    std::vector<std::uint8_t> mine(bytes, 0);
    quantize(x.data(), rows, mine.data());
    void* send = b.scratch(0, bytes);
    void* recv = b.scratch(1, bytes * static_cast<std::size_t>(b.ranks()));
    dev.copy_from_host(send, mine.data(), bytes);
    b.all_gather(const_buffer{send, bytes, dtype::u8},
                 mutable_buffer{recv, bytes * static_cast<std::size_t>(b.ranks()), dtype::u8});
  }
  template <class IO>
  void finish(IO& b) {
    b.wait();
    auto& dev = b.device();
    const std::size_t n = b.size();
    const auto rows = rows_of(b.tensors(), n);
    const std::size_t bytes = message_bytes(rows.size(), n), total = bytes * static_cast<std::size_t>(b.ranks());
    std::vector<std::uint8_t> all(total);
    dev.copy_to_host(all.data(), b.scratch(1, total), total);
    std::vector<float> mean(n);
    average(all.data(), bytes, b.ranks(), rows, mean.data(), n);
    dev.copy_from_host(b.gradients(), mean.data(), n * sizeof(float));
  }
};

}  // namespace ddp::policy::comm_hook
