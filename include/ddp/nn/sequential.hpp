#pragma once
// Layers applied in order; a model of the module concept. Parameters are named as PyTorch's
// nn.Sequential names them ("0.weight", "1.bias", ...). Backward walks the layers in reverse and
// reports each layer's parameters ready as soon as that layer is done, so a trainer reduces the
// late layers' buckets while the early layers still compute.
//
//   ddp::nn::sequential model(ddp::nn::linear(784, 512, seed), ddp::nn::relu(),
//                             ddp::nn::linear(512, 10, seed + 1));
#include <array>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/concepts/module.hpp"
#include "ddp/nn/deferred_updates.hpp"
#include "ddp/nn/layer.hpp"

namespace ddp::nn {

// A layer whose parameters can have their gradient placed (ddp::nn::parameter and
// ddp::nn::cuda::parameter can).
template <class L>
concept places_layer_gradients = requires(L& l, float* storage) { l.params()[0].place_gradient(storage); };
// ... and their value (ddp::nn::parameter and ddp::nn::cuda::parameter can).
template <class L>
concept places_layer_values = requires(L& l, float* storage) { l.params()[0].place_value(storage); };

template <layer First, layer... Rest>
class sequential {
  static_assert((std::is_same_v<typename First::matrix_type, typename Rest::matrix_type> && ...),
                "ddp::nn::sequential: every layer must work on one matrix type (all host layers, or all "
                "ddp::nn::cuda layers)");

 public:
  using matrix_type = typename First::matrix_type;
  using input_type = matrix_type;
  using output_type = matrix_type;
  static constexpr bool reports_gradient_ready = true;

  explicit sequential(First first, Rest... rest) : layers_(std::move(first), std::move(rest)...) {
    std::size_t next = 0;
    for_each_layer([&](auto& l, std::size_t k) {
      first_param_[k] = next;
      next += l.params().size();
    });
    param_count_ = next;
  }

  std::vector<parameter_ref> parameters() {
    std::vector<parameter_ref> refs;
    for_each_layer([&](auto& l, std::size_t k) {
      for (auto& p : l.params()) refs.push_back(p.ref(std::to_string(k) + "."));
    });
    return refs;
  }

  std::vector<buffer_ref> buffers() {
    std::vector<buffer_ref> refs;
    for_each_layer([&](auto& l, std::size_t k) {
      for (auto& b : l.buffer_refs(std::to_string(k) + ".")) refs.push_back(std::move(b));
    });
    return refs;
  }

  // Training forwards save what backward needs; evaluation forwards save nothing.
  void train(bool on = true) noexcept { training_ = on; }
  void eval() noexcept { training_ = false; }
  bool training() const noexcept { return training_; }

  matrix_type forward(const matrix_type& x) {
    matrix_type h = x;
    for_each_layer([&](auto& l, std::size_t k) {
      const bool hooked = hooks_ && l.params().size();
      if (hooked) hooks_->before_forward(first_param_[k], l.params().size());
      for (auto& p : l.params()) p.before_forward();
      h = l.forward(h, training_);
      if (hooked) hooks_->after_forward(first_param_[k], l.params().size());
    });
    if (training_) ++pending_;
    return h;
  }

  // Returns the gradient with respect to the forward's input when compute_input_gradient() is
  // on (the discriminator of a GAN hands it to the generator), an empty matrix otherwise.
  matrix_type backward(const matrix_type& grad_output, const ready_sink& ready) {
    if (pending_ == 0)
      throw std::logic_error("ddp::nn::sequential: backward without a training forward");
    --pending_;
    matrix_type g = grad_output;
    for_each_layer_reverse([&](auto& l, std::size_t k) {
      const bool hooked = hooks_ && l.params().size();
      if (hooked) hooks_->before_backward(first_param_[k], l.params().size());
      g = l.backward(g, /*need_dx=*/k > 0 || input_gradient_);
      if (hooked) hooks_->after_backward(first_param_[k], l.params().size());
      auto ps = l.params();
      for (std::size_t i = 0; i < ps.size(); ++i) {
        ps[i].after_backward();
        ready(first_param_[k] + i);
      }
    });
    return g;
  }
  void compute_input_gradient(bool on = true) noexcept { input_gradient_ = on; }

  // Keeps every parameter in `t` from now on (bf16 or f16: a trainer trains them through an f32
  // master copy; f32 again); cast one layer's with layer<K>().params()[i].cast(t). Before a
  // trainer is built over the module.
  void cast_parameters(dtype t) {
    for_each_layer([&](auto& l, std::size_t) {
      for (auto& p : l.params()) p.cast(t);
    });
  }

  void bind_gradient(std::size_t index, float* storage) {
    with_parameter(index, [&](auto& p) { p.bind_gradient(storage); });
  }
  void bind_parameter(std::size_t index, float* storage) {
    with_parameter(index, [&](auto& p) { p.bind_value(storage); });
  }
  // Layer by layer (update::sharded_gradients, update::fully_sharded): around each layer's forward
  // and backward the hooks hear of its parameters, and the trainer places their gradients and
  // values (ddp/concepts/module.hpp).
  void set_layer_hooks(layer_hooks* hooks) noexcept
    requires(places_layer_gradients<First> && (places_layer_gradients<Rest> && ...))
  {
    hooks_ = hooks;
  }
  void place_gradient(std::size_t index, float* storage)
    requires(places_layer_gradients<First> && (places_layer_gradients<Rest> && ...))
  {
    with_parameter(index, [&](auto& p) { p.place_gradient(storage); });
  }
  void place_parameter(std::size_t index, float* storage)
    requires(places_layer_values<First> && (places_layer_values<Rest> && ...))
  {
    with_parameter(index, [&](auto& p) { p.place_value(storage); });
  }

  // Random draws keyed by a stream (reduction::invariant: the step and the virtual shard), passed
  // to the layers that draw (nn::dropout).
  void set_random_stream(std::uint64_t stream) { detail::set_random_stream(layers_, stream); }

  // Deferred buffer updates (reduction::invariant): nn/deferred_updates.hpp.
  void defer_buffer_updates(bool on) { detail::defer_buffer_updates(layers_, on); }
  std::size_t buffer_update_size() { return detail::buffer_update_size(layers_); }
  std::vector<float> take_buffer_updates() { return detail::take_buffer_updates(layers_); }
  void apply_buffer_updates(std::span<const float> records) {
    detail::apply_buffer_updates(layers_, records, "sequential");
  }

  std::size_t parameter_count() const noexcept { return param_count_; }
  template <std::size_t K>
  auto& layer() noexcept { return std::get<K>(layers_); }

 private:
  template <class F>
  void with_parameter(std::size_t index, F&& f) {
    bool found = false;
    for_each_layer([&](auto& l, std::size_t k) {
      auto ps = l.params();
      if (!found && index >= first_param_[k] && index < first_param_[k] + ps.size()) {
        f(ps[index - first_param_[k]]);
        found = true;
      }
    });
    if (!found)
      throw std::out_of_range("ddp::nn::sequential: no parameter " + std::to_string(index) + " (it has " +
                              std::to_string(param_count_) + ")");
  }
  template <class F>
  void for_each_layer(F&& f) {
    [&]<std::size_t... K>(std::index_sequence<K...>) { (f(std::get<K>(layers_), K), ...); }
    (std::index_sequence_for<First, Rest...>{});
  }
  template <class F>
  void for_each_layer_reverse(F&& f) {
    constexpr std::size_t n = 1 + sizeof...(Rest);
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (f(std::get<n - 1 - K>(layers_), n - 1 - K), ...);
    }(std::index_sequence_for<First, Rest...>{});
  }

  std::tuple<First, Rest...> layers_;
  std::array<std::size_t, 1 + sizeof...(Rest)> first_param_{};
  std::size_t param_count_ = 0;
  std::size_t pending_ = 0;
  layer_hooks* hooks_ = nullptr;
  bool training_ = true;
  bool input_gradient_ = false;
};

}  // namespace ddp::nn
