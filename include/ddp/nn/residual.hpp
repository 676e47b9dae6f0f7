#pragma once
// A skip connection as one layer of a sequential: y = x + f(x), f being the branch's layers in
// order. Backward sends dy down both paths: through the branch, and straight to the input.
//
//   ddp::nn::sequential model(ddp::nn::linear(784, 256, seed),
//                             ddp::nn::residual(ddp::nn::layer_norm(256), ddp::nn::linear(256, 256, seed + 1),
//                                               ddp::nn::gelu(), ddp::nn::linear(256, 256, seed + 2)),
//                             ddp::nn::linear(256, 10, seed + 3));
//
// The branch's parameters are named as PyTorch names those of a module at index k holding an
// nn.Sequential: "1.1.weight" is the weight of the branch's layer 1 in the sequential's layer 1.
// params() lists them in branch order, so a sequential numbers them (ready(i), bind_gradient)
// as if the branch's layers stood in its own list; they are reported ready together, once the
// whole branch is done.
#include <cstddef>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/nn/deferred_updates.hpp"
#include "ddp/nn/layer.hpp"

namespace ddp::nn {

// y += x, elementwise; both of one shape. The CUDA twin is ddp::nn::cuda::add_into (found by
// argument-dependent lookup).
inline void add_into(matrix& y, const matrix& x) {
  for (std::size_t i = 0; i < y.size(); ++i) y.data[i] += x.data[i];
}

// A parameter of a branch seen from outside it: the same storage, its name prefixed with the
// branch's index of the layer that holds it.
template <class P>
class nested_parameter {
 public:
  nested_parameter(P& p, std::string path) : p_(&p), path_(std::move(path)) {}

  parameter_ref ref(const std::string& prefix) const { return p_->ref(prefix + path_); }
  void bind_gradient(float* storage) { p_->bind_gradient(storage); }
  void bind_value(float* storage) { p_->bind_value(storage); }
  void place_gradient(float* storage) { p_->place_gradient(storage); }
  void place_value(float* storage) { p_->place_value(storage); }
  void before_forward() { p_->before_forward(); }
  void after_backward() { p_->after_backward(); }
  void cast(dtype t) { p_->cast(t); }
  dtype type() const noexcept { return p_->type(); }
  std::string name() const { return path_ + p_->name(); }
  P& target() noexcept { return *p_; }
  const std::string& path() const noexcept { return path_; }

 private:
  P* p_;
  std::string path_;
};

namespace detail {

template <class P>
struct unnested {
  using type = P;
};
template <class P>
struct unnested<nested_parameter<P>> {
  using type = P;
};
template <class L>
using parameter_of = typename unnested<std::remove_cvref_t<decltype(std::declval<L&>().params()[0])>>::type;

template <class P>
nested_parameter<P> nest(P& p, const std::string& path) {
  return {p, path};
}
template <class P>
nested_parameter<P> nest(nested_parameter<P>& p, const std::string& path) {
  return {p.target(), path + p.path()};
}

}  // namespace detail

template <layer First, layer... Rest>
class residual {
  static_assert((std::is_same_v<typename First::matrix_type, typename Rest::matrix_type> && ...),
                "ddp::nn::residual: every layer of the branch must work on one matrix type (all host layers, or "
                "all ddp::nn::cuda layers)");
  static_assert((std::is_same_v<detail::parameter_of<First>, detail::parameter_of<Rest>> && ...),
                "ddp::nn::residual: every layer of the branch must hold one parameter type");

 public:
  using matrix_type = typename First::matrix_type;
  using parameter_type = detail::parameter_of<First>;

  explicit residual(First first, Rest... rest) : branch_(std::move(first), std::move(rest)...) {}

  matrix_type forward(const matrix_type& x, bool training) {
    matrix_type h;  // the first layer reads x itself: no copy; the others are handed h to keep or reuse
    for_each_layer([&](auto& l, std::size_t k) { h = k == 0 ? l.forward(x, training) : l.forward(std::move(h), training); });
    if (rows_of(h) != rows_of(x) || cols_of(h) != cols_of(x))
      throw error("nn", "residual forward", -1,
                  "the branch maps " + std::to_string(rows_of(x)) + " x " + std::to_string(cols_of(x)) + " to " +
                      std::to_string(rows_of(h)) + " x " + std::to_string(cols_of(h)) +
                      "; y = x + f(x) needs f to keep the shape (end the branch with a layer of " +
                      std::to_string(cols_of(x)) + " outputs)");
    add_into(h, x);
    return h;
  }

  // dx = dy + (the branch's dx): the gradient reaches the input along both paths.
  matrix_type backward(const matrix_type& dy, bool need_dx) {
    constexpr std::size_t last = sizeof...(Rest);
    matrix_type g;  // the last layer reads dy itself: no copy; the others are handed g to reuse
    for_each_layer_reverse([&](auto& l, std::size_t k) {
      g = k == last ? l.backward(dy, k > 0 || need_dx) : l.backward(std::move(g), k > 0 || need_dx);
    });
    if (!need_dx) return {};
    add_into(g, dy);
    return g;
  }

  // Views of the branch's parameters, in branch order (built on each call: cheap, a few per layer).
  std::vector<nested_parameter<parameter_type>> params() {
    std::vector<nested_parameter<parameter_type>> out;
    for_each_layer([&](auto& l, std::size_t k) {
      for (auto& p : l.params()) out.push_back(detail::nest(p, std::to_string(k) + "."));
    });
    return out;
  }
  std::vector<buffer_ref> buffer_refs(const std::string& prefix) {
    std::vector<buffer_ref> out;
    for_each_layer([&](auto& l, std::size_t k) {
      for (auto& b : l.buffer_refs(prefix + std::to_string(k) + ".")) out.push_back(std::move(b));
    });
    return out;
  }

  // Random draws keyed by a stream, passed to the branch's layers that draw (nn::dropout).
  void set_random_stream(std::uint64_t stream) { detail::set_random_stream(branch_, stream); }

  // Deferred buffer updates of the branch's layers (reduction::invariant): nn/deferred_updates.hpp.
  void defer_buffer_updates(bool on) { detail::defer_buffer_updates(branch_, on); }
  std::size_t buffer_update_size() { return detail::buffer_update_size(branch_); }
  std::vector<float> take_buffer_updates() { return detail::take_buffer_updates(branch_); }
  void apply_buffer_updates(std::span<const float> records) { detail::apply_buffer_updates(branch_, records, "residual"); }

  template <std::size_t K>
  auto& layer() noexcept { return std::get<K>(branch_); }

 private:
  static std::size_t rows_of(const matrix_type& m) {
    if constexpr (requires { m.rows(); }) return m.rows(); else return m.rows;
  }
  static std::size_t cols_of(const matrix_type& m) {
    if constexpr (requires { m.cols(); }) return m.cols(); else return m.cols;
  }
  template <class F>
  void for_each_layer(F&& f) {
    [&]<std::size_t... K>(std::index_sequence<K...>) { (f(std::get<K>(branch_), K), ...); }
    (std::index_sequence_for<First, Rest...>{});
  }
  template <class F>
  void for_each_layer_reverse(F&& f) {
    constexpr std::size_t n = 1 + sizeof...(Rest);
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (f(std::get<n - 1 - K>(branch_), n - 1 - K), ...);
    }(std::index_sequence_for<First, Rest...>{});
  }

  std::tuple<First, Rest...> branch_;
};

}  // namespace ddp::nn
