#pragma once
// What ddp::nn::sequential needs of a layer. Each layer keeps a stack of what its training
// forwards saved; backward pops the innermost.
//
//   matrix forward(const matrix& x, bool training);   training: push what backward needs
//   matrix backward(const matrix& dy, bool need_dx);  accumulate parameter gradients, pop
//   std::span<parameter> params();                    empty for layers without parameters
//   std::vector<buffer_ref> buffer_refs(const std::string& prefix);
#include <concepts>
#include <span>
#include <string>
#include <vector>

#include "ddp/nn/matrix.hpp"
#include "ddp/nn/parameter.hpp"

namespace ddp::nn {

template <class L>
concept layer = requires(L& l, const matrix& x, bool flag, const std::string& prefix) {
  { l.forward(x, flag) } -> std::same_as<matrix>;
  { l.backward(x, flag) } -> std::same_as<matrix>;
  { l.params() } -> std::same_as<std::span<parameter>>;
  { l.buffer_refs(prefix) } -> std::same_as<std::vector<buffer_ref>>;
};

// Pops the innermost saved entry, naming the layer when there is none.
template <class T>
T pop_saved(std::vector<T>& saved, const char* layer) {
  if (saved.empty())
    throw std::logic_error(std::string("ddp::nn: ") + layer +
                           " backward without a matching training forward");
  T top = std::move(saved.back());
  saved.pop_back();
  return top;
}

}  // namespace ddp::nn
