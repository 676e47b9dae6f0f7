#pragma once
// What ddp::nn::sequential needs of a layer. Each layer keeps a stack of what its training
// forwards saved; backward pops the innermost.
//
//   using matrix_type = ...;                           the activations' type
//   matrix_type forward(const matrix_type& x, bool training);   training: push what backward needs
//   matrix_type backward(const matrix_type& dy, bool need_dx);  accumulate parameter gradients, pop
//   std::span<P> params();                             empty for layers without parameters; any
//        range with size() and operator[] of P-like views will do (ddp::nn::residual hands out
//        nested_parameter views of its branch's parameters)
//        P: ddp::nn::parameter or ddp::nn::cuda::parameter (any dtype; sequential calls
//        before_forward() and after_backward() around the layer, which reads value() and
//        accumulates into grad() in f32)
//   std::vector<buffer_ref> buffer_refs(const std::string& prefix);
// Optionally, forward(matrix_type&& x, bool) and backward(matrix_type&& dy, bool): the same, free
// to keep or reuse the storage of an input nobody reads after (ddp::nn::residual hands the layers
// of a branch after the first their input so).
#include <concepts>
#include <span>
#include <string>
#include <vector>

#include "ddp/nn/matrix.hpp"
#include "ddp/nn/parameter.hpp"

namespace ddp::nn {

// `matrix_type` is the activation type: ddp::nn::matrix on the host, ddp::nn::cuda::matrix on a
// GPU. params() is a span of parameters that hand out refs and take bound gradient and value
// storage.
template <class L>
concept layer = requires { typename L::matrix_type; } &&
                requires(L& l, const typename L::matrix_type& x, bool flag, const std::string& prefix, float* storage) {
                  { l.forward(x, flag) } -> std::same_as<typename L::matrix_type>;
                  { l.backward(x, flag) } -> std::same_as<typename L::matrix_type>;
                  { l.params().size() } -> std::convertible_to<std::size_t>;
                  { l.params()[0].ref(prefix) } -> std::same_as<parameter_ref>;
                  l.params()[0].bind_gradient(storage);
                  l.params()[0].bind_value(storage);
                  l.params()[0].before_forward();
                  l.params()[0].after_backward();
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
