#pragma once
// What the documentation's snippets take as given: a model, its batches, a data set. Each
// snippet file compiles its snippets (between `// [doc: PAGE]` and `// [end doc]`) as written in
// the page; tests/docs/snippets_test.cpp checks that every ```cpp block of docs/ and README.md is
// one of them, word for word. A snippet inside a function repeats its page's #include lines,
// which are no-ops there (the headers are already included above: #pragma once).
#include <ddp/data/fashion_mnist.hpp>
#include <ddp/data/loader.hpp>
#include <ddp/ddp.hpp>
#include <ddp/nn/cross_entropy.hpp>
#include <ddp/nn/linear.hpp>
#include <ddp/nn/relu.hpp>
#include <ddp/nn/sequential.hpp>

#include <cstdint>
#include <cstdio>
#include <string_view>
#include <vector>

namespace snippets {

using model = ddp::nn::sequential<ddp::nn::linear, ddp::nn::relu, ddp::nn::linear>;
inline model make_model(std::uint64_t seed) {
  return model(ddp::nn::linear(784, 128, seed), ddp::nn::relu(), ddp::nn::linear(128, 10, seed + 1));
}
using my_model = model;
using ddp::data::fashion_mnist;
inline constexpr auto collate = &fashion_mnist::collate;
using loader_type = ddp::data::loader<fashion_mnist, decltype(&fashion_mnist::collate)>;
inline void log(float value) { std::printf("%g\n", static_cast<double>(value)); }

}  // namespace snippets
