#pragma once
// The bound that fp16 and bf16 communication hooks keep against one process on the global batch,
// shared by the in-process and MPI suites.
//
// The bound (docs/policies.md, "CommHook"): each rank's gradient g_i is multiplied by 1/N in f32
// and rounded to 16 bits (unit roundoff u: 2^-8 for bf16, 2^-11 for f16); the in-process backend
// sums those in f32 and rounds once more. Per element the averaged gradient is then off by at most
// rho * m, with m = mean_i |g_i| and rho = 2u + (N + 1) 2^-24 (first order), plus, for f16, an
// absolute (N + 1) 2^-25 where values fall below its normal range. MPI and NCCL round every step
// of the sum to 16 bits: N - 1 roundings instead of one, rho = N u + ... SGD with momentum mu carries
// step k's error into the remaining K - k updates with weights 1, mu, mu^2...: after K steps the
// parameters are off by at most lr * sum_k c_k * (rho ||m_k|| + abs sqrt(n)), c_k = sum_{j<K-k}
// mu^j, times a factor F for the gradients' own dependence on the parameters (the hooked run
// evaluates them at slightly different points; (1 + lr L)^K, taken as 2 here and shown to hold by
// the measured ratio).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "support/relative_error.hpp"
#include "trainer/equivalence.hpp"
#include "trainer/test_model.hpp"

namespace hook_bound {

using namespace equivalence;

// rho for N ranks and unit roundoff u: the pre-divided value's rounding, then `roundings` of the
// sum (1 on the host backends, which add in f32; N - 1 where each step of the sum is rounded to
// 16 bits, as MPI's and NCCL's), and the f32 terms.
inline double rho(int world, double u, int roundings) {
  const double n = world;
  return (u + roundings * u + (n + 1) * 0x1p-24) * (1 + 2 * u);
}

// The reference run and, per parameter tensor, the bound on ||distributed - reference|| / ||reference||.
struct bounded_reference {
  std::vector<std::vector<float>> params;
  std::vector<double> bound;
};

inline bounded_reference reference_with_bound(int world, double rho, double absolute) {
  constexpr double feedback = 2.0;
  auto model = test::make_mlp(seed);
  test::reference_sgd opt(model, sgd);
  const std::size_t tensors = model.parameters().size();
  std::vector<double> spread(tensors, 0.0), absolute_spread(tensors, 0.0);
  for (int s = 0; s < steps; ++s) {
    const auto global = test::make_batch(per_rank_batch * static_cast<std::size_t>(world), 1000 + s);
    // m = mean over the ranks of |each rank's gradient|, at the reference's parameters.
    std::vector<std::vector<double>> m(tensors);
    for (int r = 0; r < world; ++r) {
      const auto mine = global.rows(per_rank_batch * static_cast<std::size_t>(r), per_rank_batch * static_cast<std::size_t>(r + 1));
      model.backward(ddp::nn::softmax_cross_entropy(model.forward(mine.x), mine.y).grad, ddp::ready_sink{});
      std::size_t t = 0;
      for (auto& p : model.parameters()) {
        auto g = p.grad.template as<float>();
        m[t].resize(g.size(), 0.0);
        for (std::size_t i = 0; i < g.size(); ++i) m[t][i] += std::fabs(g[i]) / world;
        std::fill(g.begin(), g.end(), 0.0f);
        ++t;
      }
    }
    double carried = 0;  // c_k: how much of step k's error the remaining updates carry
    for (int j = 0; j < steps - s; ++j) carried += std::pow(static_cast<double>(sgd.momentum), j);
    for (std::size_t t = 0; t < tensors; ++t) {
      double norm = 0;
      for (double v : m[t]) norm += v * v;
      spread[t] += carried * std::sqrt(norm);
      absolute_spread[t] += carried * std::sqrt(static_cast<double>(m[t].size()));
    }
    model.backward(ddp::nn::softmax_cross_entropy(model.forward(global.x), global.y).grad, ddp::ready_sink{});
    opt.step();
  }
  bounded_reference out{test::parameter_values(model), {}};
  for (std::size_t t = 0; t < tensors; ++t) {
    double norm = 0;
    for (float v : out.params[t]) norm += static_cast<double>(v) * v;
    out.bound.push_back(feedback * sgd.lr * (rho * spread[t] + absolute * absolute_spread[t]) / std::sqrt(norm));
  }
  return out;
}

// Per tensor ||a - b|| / ||b||.
inline std::vector<double> relative_errors(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  std::vector<double> out;
  for (std::size_t t = 0; t < a.size(); ++t) out.push_back(test::max_relative_error({a[t]}, {b[t]}));
  return out;
}

// Checks one rank's parameters against the bound; returns its largest relative error and largest
// share of the bound.
inline std::pair<double, double> check(const std::vector<std::vector<float>>& params, const bounded_reference& ref) {
  const auto errors = relative_errors(params, ref.params);
  double largest = 0, share = 0;
  for (std::size_t t = 0; t < errors.size(); ++t) {
    CAPTURE(t);
    CHECK(errors[t] <= ref.bound[t]);
    share = std::max(share, errors[t] / ref.bound[t]);
    largest = std::max(largest, errors[t]);
  }
  // The gradients did travel in 16 bits: f32 reductions stay within 1e-6 of the reference here.
  CHECK(largest > 1e-6);
  return {largest, share};
}

}  // namespace hook_bound
