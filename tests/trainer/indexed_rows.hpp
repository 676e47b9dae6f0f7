#pragma once
// The toy problem (test_model.hpp) as a data set whose examples know their index: the elastic
// tests count which samples each step took.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ddp/ddp.hpp"
#include "trainer/test_model.hpp"

namespace test {

// The toy problem, each example knowing its index.
struct indexed_rows {
  struct example {
    const float* x;
    std::int32_t y;
    std::size_t index;
  };
  using example_type = example;
  struct batch {
    ddp::nn::matrix x;
    std::vector<std::int32_t> y;
    std::vector<std::size_t> index;
  };
  test::batch all;  // the toy problem's rows
  explicit indexed_rows(std::size_t n) : all(make_batch(n, 31)) {}
  std::size_t size() const { return all.y.size(); }
  example get(std::size_t i) const { return {all.x.row(i), all.y[i], i}; }
  static batch collate(std::span<const example> xs) {
    batch b{ddp::nn::matrix(xs.size(), in_features), {}, {}};
    for (std::size_t r = 0; r < xs.size(); ++r) {
      std::copy(xs[r].x, xs[r].x + in_features, b.x.row(r));
      b.y.push_back(xs[r].y);
      b.index.push_back(xs[r].index);
    }
    return b;
  }
};

// The indices of a batch's real samples (weight-0 padding left out).
template <class Batch>
std::vector<std::size_t> real_samples(const Batch& b) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < b.index.size(); ++i)
    if (b.weights.per_sample[i] > 0.0f) out.push_back(b.index[i]);
  return out;
}

}  // namespace test
