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
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ddp/concepts/module.hpp"
#include "ddp/nn/layer.hpp"

namespace ddp::nn {

template <layer... Layers>
class sequential {
 public:
  using input_type = matrix;
  using output_type = matrix;
  static constexpr bool reports_gradient_ready = true;

  explicit sequential(Layers... layers) : layers_(std::move(layers)...) {
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

  matrix forward(const matrix& x) {
    matrix h = x;
    for_each_layer([&](auto& l, std::size_t) { h = l.forward(h, training_); });
    if (training_) ++pending_;
    return h;
  }

  void backward(const matrix& grad_output, const ready_sink& ready) {
    if (pending_ == 0)
      throw std::logic_error("ddp::nn::sequential: backward without a training forward");
    --pending_;
    matrix g = grad_output;
    for_each_layer_reverse([&](auto& l, std::size_t k) {
      g = l.backward(g, /*need_dx=*/k > 0);
      for (std::size_t i = 0; i < l.params().size(); ++i) ready(first_param_[k] + i);
    });
  }

  void bind_gradient(std::size_t index, float* storage) {
    bool bound = false;
    for_each_layer([&](auto& l, std::size_t k) {
      auto ps = l.params();
      if (!bound && index >= first_param_[k] && index < first_param_[k] + ps.size()) {
        ps[index - first_param_[k]].bind_gradient(storage);
        bound = true;
      }
    });
    if (!bound)
      throw std::out_of_range("ddp::nn::sequential: no parameter " + std::to_string(index));
  }

  std::size_t parameter_count() const noexcept { return param_count_; }
  template <std::size_t K>
  auto& layer() noexcept { return std::get<K>(layers_); }

 private:
  template <class F>
  void for_each_layer(F&& f) {
    [&]<std::size_t... K>(std::index_sequence<K...>) { (f(std::get<K>(layers_), K), ...); }
    (std::index_sequence_for<Layers...>{});
  }
  template <class F>
  void for_each_layer_reverse(F&& f) {
    constexpr std::size_t n = sizeof...(Layers);
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (f(std::get<n - 1 - K>(layers_), n - 1 - K), ...);
    }(std::index_sequence_for<Layers...>{});
  }

  std::tuple<Layers...> layers_;
  std::array<std::size_t, sizeof...(Layers)> first_param_{};
  std::size_t param_count_ = 0;
  std::size_t pending_ = 0;
  bool training_ = true;
};

}  // namespace ddp::nn
