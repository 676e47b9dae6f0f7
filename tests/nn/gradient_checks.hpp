#pragma once
// What the layer suites share: a seeded random matrix, and a module's or layer's backward through
// the library's check (central finite differences of sum(w . forward(x)) for every parameter
// element and every input element).
#include <cstdint>

#include <doctest/doctest.h>

#include "ddp/core/random.hpp"
#include "ddp/nn/check_gradients.hpp"
#include "ddp/nn/matrix.hpp"

namespace nn_test {

inline ddp::nn::matrix random_matrix(std::size_t r, std::size_t c, std::uint64_t seed, float scale = 1.0f) {
  ddp::splitmix64 rng(seed);
  ddp::nn::matrix m(r, c);
  for (auto& v : m.data) v = rng.uniform(-scale, scale);
  return m;
}

template <class M, class Input>
void require_gradients(M& m, const Input& x, ddp::nn::gradient_check_options options = {}) {
  const auto report = ddp::nn::check_gradients(m, x, options);
  INFO(report.message());
  CHECK(report.checked > 0);
  CHECK(report.passed());
}

}  // namespace nn_test
