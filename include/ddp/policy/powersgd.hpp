#pragma once
// comm_hook::powersgd<Rank>: gradients reduced as low-rank factors (Vogels, Karimireddy and
// Jaggi, "PowerSGD", NeurIPS 2019), as PyTorch's powerSGD_hook does it.
//
// Each parameter's gradient in a bucket is viewed as a matrix M (its first dimension by the
// rest). Where (rows + cols) * r * min_compression_rate < rows * cols, with r = min(rows, cols,
// Rank), M travels as two factors instead:
//   P = M Q          (Q: cols x r, orthonormal columns)    all_reduce(P, sum), orthonormalise P
//   Q = M^T P                                              all_reduce(Q, sum), Q /= ranks
//   M ~ P Q^T        the average's projection on P's columns, written back as the gradient
// so (rows + cols) * r floats cross per matrix instead of rows * cols. The rest (vectors, small
// matrices) is averaged in f32 in one collective per bucket.
//
//   error_feedback  what the approximation left out of this rank's M is added to its next M
//                   (the compressed tensors only; the rest is reduced exactly).
//   warm_start      Q starts from the previous step's; otherwise from normal random numbers
//                   each step (the same on every rank: seeded by seed, bucket and step).
//   start_after     the first optimizer steps reduce plainly (PyTorch's start_powerSGD_iter):
//                   compression early in training costs accuracy most.
// The error and Q are the hook's state: trainer.save keeps them, trainer.load restores them.
//
// Products run on the trainer's device, found by argument-dependent lookup: include
// <ddp/host/linalg.hpp> (CBLAS: link ddp::nn) for the host device, <ddp/cuda/linalg.hpp>
// (cuBLAS) for a GPU. A policy knows no device, so this header includes neither.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/core/random.hpp"
#include "ddp/core/segment.hpp"
#include "ddp/policy/comm_hook.hpp"

namespace ddp::policy::comm_hook {

namespace detail {

// A bucket's tensors as PowerSGD treats them: each compressed matrix with its factors' offsets
// in the bucket's P and Q memory, and the tensors averaged as they are.
struct factored {
  tensor_layout t;
  std::size_t rank = 0;
  std::size_t p = 0;  // offset of P (rows x rank)
  std::size_t q = 0;  // offset of Q (cols x rank)
};
struct bucket_plan {
  std::vector<factored> compressed;
  // The tensors averaged whole: gradients at `tensor`, packed one after another from offset 0
  // (the device's pack and unpack move them).
  std::vector<segment> plain;
  std::size_t p_floats = 0, q_floats = 0, plain_floats = 0;
};

// `gradients`: the bucket's, where the plain tensors' segments point (nullptr: sizes only).
inline bucket_plan plan(std::span<const tensor_layout> tensors, std::size_t max_rank, float min_compression_rate,
                        float* gradients = nullptr) {
  bucket_plan out;
  for (const auto& t : tensors) {
    const std::size_t r = std::min({t.rows, t.cols, max_rank});
    const double whole = static_cast<double>(t.rows) * static_cast<double>(t.cols);
    const double factors = static_cast<double>(t.rows + t.cols) * static_cast<double>(r);
    if (r > 0 && factors * min_compression_rate < whole) {
      out.compressed.push_back({t, r, out.p_floats, out.q_floats});
      out.p_floats += t.rows * r;
      out.q_floats += t.cols * r;
    } else {
      out.plain.push_back({gradients ? gradients + t.offset : nullptr, out.plain_floats, t.rows * t.cols});
      out.plain_floats += t.rows * t.cols;
    }
  }
  return out;
}

// Standard normal numbers, the same on every rank for one (seed, bucket, step).
inline std::vector<float> normals(std::size_t n, std::uint64_t seed, std::size_t bucket, std::uint64_t step) {
  splitmix64 mix(seed ^ 0x9e3779b97f4a7c15ull * (bucket + 1));
  splitmix64 g(mix.next() ^ step);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; i += 2) {  // Box-Muller: two numbers per pair of uniforms
    const double u1 = (static_cast<double>(g.next() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(g.next() >> 11) * 0x1.0p-53;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(radius * std::cos(2.0 * std::numbers::pi * u2));
    if (i + 1 < n) out[i + 1] = static_cast<float>(radius * std::sin(2.0 * std::numbers::pi * u2));
  }
  return out;
}

template <std::size_t Rank>
inline constexpr auto name_text = [] {
  std::array<char, 32> s{};
  std::size_t n = 0;
  for (const char c : std::string_view("powersgd<")) s[n++] = c;
  char digits[20]{};
  std::size_t d = 0;
  for (std::size_t v = Rank; v; v /= 10) digits[d++] = static_cast<char>('0' + v % 10);
  while (d) s[n++] = digits[--d];
  s[n++] = '>';
  return std::pair{s, n};
}();

}  // namespace detail

template <std::size_t Rank>
struct powersgd {
  static_assert(Rank >= 1 && Rank <= 1024, "ddp: comm_hook::powersgd<Rank> takes a rank from 1 to 1024");
  using slot = comm_hook::slot;
  static constexpr std::size_t rank = Rank;
  static constexpr std::string_view name{detail::name_text<Rank>.first.data(),
                                         detail::name_text<Rank>.second};

  std::uint64_t start_after = 1000;  // optimizer steps reduced plainly first
  float min_compression_rate = 2.0f;
  bool error_feedback = true;
  bool warm_start = true;
  float epsilon = 1e-8f;  // added to each norm in the orthonormalisation: a zero column stays zero
  std::uint64_t seed = 0;

  template <class IO>
  void reduce(IO& b) {
    if (b.step() < start_after) return b.reduce_gradients();
    auto& dev = b.device();
    using device_type = std::remove_reference_t<decltype(dev)>;
    static_assert(requires(device_type& d, float* x) {
      gemm(d, false, false, 1, 1, 1, 1.0f, x, 1, x, 1, 0.0f, x, 1);
      axpy(d, 1, 1.0f, x, x);
      orthonormalize_columns(d, x, 1, 1, 0.0f);
    }, "ddp: comm_hook::powersgd finds no matrix algebra for this device: include <ddp/host/linalg.hpp> for "
       "ddp::host::device (link ddp::nn), <ddp/cuda/linalg.hpp> for ddp::cuda::device, or declare gemm, axpy "
       "and orthonormalize_columns for your device in its namespace, as those headers do");
    float* g = b.gradients();
    const auto plan = detail::plan(b.tensors(), Rank, min_compression_rate, g);
    float* m = compressed_input(b, plan);
    const hook_state q_state = b.state(1, plan.q_floats * sizeof(float));
    auto* q = static_cast<float*>(q_state.data);
    if (plan.q_floats && (!warm_start || q_state.fresh)) {
      const auto init = detail::normals(plan.q_floats, seed, b.index(), b.step());
      dev.copy_from_host(q, init.data(), plan.q_floats * sizeof(float));
    }
    auto* p = static_cast<float*>(b.scratch(0, plan.p_floats * sizeof(float)));
    for (const auto& f : plan.compressed) {
      orthonormalize_columns(dev, q + f.q, f.t.cols, f.rank, epsilon);
      gemm(dev, false, false, f.t.rows, f.rank, f.t.cols, 1.0f, m + f.t.offset, f.t.cols, q + f.q, f.rank, 0.0f,
           p + f.p, f.rank);
    }
    if (plan.plain_floats) {
      auto* u = static_cast<float*>(b.scratch(1, plan.plain_floats * sizeof(float)));
      dev.pack(plan.plain, u);
      all_reduce_in_place(b, u, plan.plain_floats, reduce_op::avg);
    }
    // Summed, not averaged: P is orthonormalised next, which undoes any scale.
    if (plan.p_floats) all_reduce_in_place(b, p, plan.p_floats, reduce_op::sum);
  }

  template <class IO>
  void finish(IO& b) {
    if (b.step() < start_after) return;
    b.wait();
    auto& dev = b.device();
    float* g = b.gradients();
    const auto plan = detail::plan(b.tensors(), Rank, min_compression_rate, g);
    float* m = error_feedback ? float_state(b, 0, b.size()) : g;
    auto* q = float_state(b, 1, plan.q_floats);
    auto* p = static_cast<float*>(b.scratch(0, plan.p_floats * sizeof(float)));
    for (const auto& f : plan.compressed) {
      orthonormalize_columns(dev, p + f.p, f.t.rows, f.rank, epsilon);
      gemm(dev, true, false, f.t.cols, f.rank, f.t.rows, 1.0f, m + f.t.offset, f.t.cols, p + f.p, f.rank, 0.0f,
           q + f.q, f.rank);
    }
    if (plan.q_floats) {
      all_reduce_in_place(b, q, plan.q_floats, reduce_op::sum);
      b.wait();
      dev.scale(q, plan.q_floats, 1.0f / static_cast<float>(b.ranks()));
    }
    for (const auto& f : plan.compressed) {
      gemm(dev, false, true, f.t.rows, f.t.cols, f.rank, 1.0f, p + f.p, f.rank, q + f.q, f.rank, 0.0f, g + f.t.offset,
           f.t.cols);
      if (error_feedback) axpy(dev, f.t.rows * f.t.cols, -1.0f, g + f.t.offset, m + f.t.offset);  // M - P Q^T
    }
    if (plan.plain_floats)
      dev.unpack(plan.plain, static_cast<const float*>(b.scratch(1, plan.plain_floats * sizeof(float))));
  }

 private:
  template <class IO>
  static void all_reduce_in_place(IO& b, float* x, std::size_t n, reduce_op op) {
    b.all_reduce(const_buffer{x, n, dtype::f32}, mutable_buffer{x, n, dtype::f32}, op);
  }
  template <class IO>
  static float* float_state(IO& b, int slot, std::size_t floats) {
    return static_cast<float*>(b.state(slot, floats * sizeof(float)).data);
  }
  // The matrices to compress: the gradients, or with error feedback the gradients plus what the
  // last step's approximation left out, summed into the error's memory (it becomes the next error).
  template <class IO>
  float* compressed_input(IO& b, const detail::bucket_plan& plan) {
    if (!error_feedback) return b.gradients();
    float* e = float_state(b, 0, b.size());
    for (const auto& f : plan.compressed)
      axpy(b.device(), f.t.rows * f.t.cols, 1.0f, b.gradients() + f.t.offset, e + f.t.offset);
    return e;
  }
};

}  // namespace ddp::policy::comm_hook
