#pragma once
// Models and data shared by the trainer tests, and a single-process reference trainer that
// runs the same model on the whole global batch with no ddp machinery at all.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "ddp/core/random.hpp"
#include "ddp/host/half.hpp"
#include "ddp/host/kernels.hpp"
#include "ddp/nn/cross_entropy.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/relu.hpp"
#include "ddp/nn/sequential.hpp"
#include "support/relative_error.hpp"

namespace test {

// y = x * gamma + beta per feature, with BatchNorm-style buffers: in training it tracks the
// running mean of its input (momentum 0.1) and counts batches. Its training output does not
// depend on the batch, so K steps on N ranks equal K steps on the global batch exactly, while
// every buffer-sync policy still has real buffers to keep in sync.
class tracked_affine {
 public:
  using matrix_type = ddp::nn::matrix;
  explicit tracked_affine(std::size_t f)
      : f_(f), running_mean_("running_mean", f, 0.0f), batches_("num_batches_tracked", 1, 0) {
    params_.emplace_back("weight", ddp::shape_t{static_cast<std::int64_t>(f)});
    params_.emplace_back("bias", ddp::shape_t{static_cast<std::int64_t>(f)});
    for (std::size_t c = 0; c < f; ++c) params_[0].value()[c] = 1.0f + 0.01f * static_cast<float>(c);
  }
  ddp::nn::matrix forward(const ddp::nn::matrix& x, bool training) {
    ddp::nn::matrix y(x.rows, f_);
    auto g = params_[0].value();
    auto b = params_[1].value();
    for (std::size_t r = 0; r < x.rows; ++r)
      for (std::size_t c = 0; c < f_; ++c) y(r, c) = x(r, c) * g[c] + b[c];
    if (training) {
      std::vector<float> mean(f_);
      for (std::size_t c = 0; c < f_; ++c) {
        double s = 0;
        for (std::size_t r = 0; r < x.rows; ++r) s += x(r, c);
        mean[c] = static_cast<float>(s / static_cast<double>(x.rows));
      }
      if (defer_) pending_.insert(pending_.end(), mean.begin(), mean.end());
      else apply_buffer_updates(mean);
      saved_.push_back(x);
    }
    return y;
  }
  // Deferred buffer updates (reduction::invariant): a record is the batch mean.
  void defer_buffer_updates(bool on) { defer_ = on; }
  std::size_t buffer_update_size() const { return f_; }
  std::vector<float> take_buffer_updates() { return std::exchange(pending_, {}); }
  void apply_buffer_updates(std::span<const float> records) {
    for (std::size_t k = 0; k < records.size(); k += f_) {
      auto rm = running_mean_.write();
      for (std::size_t c = 0; c < f_; ++c) rm[c] = 0.9f * rm[c] + 0.1f * records[k + c];
      ++batches_.write()[0];
    }
  }
  ddp::nn::matrix backward(const ddp::nn::matrix& dy, bool need_dx) {
    auto x = ddp::nn::pop_saved(saved_, "tracked_affine");
    auto g = params_[0].value();
    auto dg = params_[0].grad();
    auto db = params_[1].grad();
    ddp::nn::matrix dx(dy.rows, f_);
    for (std::size_t r = 0; r < dy.rows; ++r)
      for (std::size_t c = 0; c < f_; ++c) {
        dg[c] += dy(r, c) * x(r, c);
        db[c] += dy(r, c);
        dx(r, c) = dy(r, c) * g[c];
      }
    if (!need_dx) return {};
    return dx;
  }
  std::span<ddp::nn::parameter> params() noexcept { return params_; }
  std::vector<ddp::buffer_ref> buffer_refs(const std::string& prefix) {
    return {running_mean_.ref(prefix), batches_.ref(prefix)};
  }
  std::span<const float> running_mean() const { return running_mean_.read(); }

 private:
  std::size_t f_;
  std::vector<ddp::nn::parameter> params_;
  ddp::nn::buffer<float> running_mean_;
  ddp::nn::buffer<std::int64_t> batches_;
  std::vector<ddp::nn::matrix> saved_;
  bool defer_ = false;
  std::vector<float> pending_;
};

using mlp = ddp::nn::sequential<ddp::nn::linear, tracked_affine, ddp::nn::relu, ddp::nn::linear,
                                ddp::nn::relu, ddp::nn::linear>;

inline constexpr std::size_t in_features = 6, classes = 3;

inline mlp make_mlp(std::uint64_t seed) {
  return mlp(ddp::nn::linear(in_features, 16, seed), tracked_affine(16), ddp::nn::relu(),
             ddp::nn::linear(16, 12, seed + 1), ddp::nn::relu(), ddp::nn::linear(12, classes, seed + 2));
}

// test::mlp seen through the module concept alone: it binds neither gradients nor parameter
// values, so the trainer copies them into and out of its buckets.
class unbound_mlp {
 public:
  using input_type = ddp::nn::matrix;
  using output_type = ddp::nn::matrix;
  static constexpr bool reports_gradient_ready = true;

  explicit unbound_mlp(mlp m) : m_(std::move(m)) {}
  std::vector<ddp::parameter_ref> parameters() { return m_.parameters(); }
  std::vector<ddp::buffer_ref> buffers() { return m_.buffers(); }
  ddp::nn::matrix forward(const ddp::nn::matrix& x) { return m_.forward(x); }
  void backward(const ddp::nn::matrix& g, const ddp::ready_sink& ready) { m_.backward(g, ready); }
  void defer_buffer_updates(bool on) { m_.defer_buffer_updates(on); }
  std::size_t buffer_update_size() { return m_.buffer_update_size(); }
  std::vector<float> take_buffer_updates() { return m_.take_buffer_updates(); }
  void apply_buffer_updates(std::span<const float> records) { m_.apply_buffer_updates(records); }
  mlp& inner() noexcept { return m_; }

 private:
  mlp m_;
};

inline mlp& underlying(mlp& m) { return m; }
inline mlp& underlying(unbound_mlp& m) { return m.inner(); }

struct batch {
  ddp::nn::matrix x;
  std::vector<std::int32_t> y;

  batch rows(std::size_t begin, std::size_t end) const {
    return {ddp::nn::slice_rows(x, begin, end), std::vector<std::int32_t>(y.begin() + static_cast<std::ptrdiff_t>(begin),
                                                                   y.begin() + static_cast<std::ptrdiff_t>(end))};
  }
};

// A learnable toy problem: the class is the arg-max of three fixed projections of x.
inline batch make_batch(std::size_t n, std::uint64_t seed) {
  ddp::splitmix64 rng(seed);
  batch b{ddp::nn::matrix(n, in_features), std::vector<std::int32_t>(n)};
  for (std::size_t r = 0; r < n; ++r) {
    float score[classes] = {};
    for (std::size_t c = 0; c < in_features; ++c) {
      const float v = rng.uniform(-2.0f, 2.0f);
      b.x(r, c) = v;
      for (std::size_t k = 0; k < classes; ++k) score[k] += v * static_cast<float>((c * 3 + k * 5) % 7) - 3.0f * (k == c % 3);
    }
    b.y[r] = static_cast<std::int32_t>(std::max_element(score, score + classes) - score);
  }
  return b;
}

// The toy problem as a data set for ddp::data::loader: n rows of make_batch(n, seed), one sample
// each, and the collate that puts rows back into a batch.
struct toy_dataset {
  struct example {
    const float* x;
    std::int32_t y;
  };
  using example_type = example;
  batch all;
  toy_dataset(std::size_t n, std::uint64_t seed) : all(make_batch(n, seed)) {}
  std::size_t size() const { return all.y.size(); }
  example get(std::size_t i) const { return {all.x.row(i), all.y[i]}; }
  static batch collate(std::span<const example> xs) {
    batch b{ddp::nn::matrix(xs.size(), in_features), {}};
    for (std::size_t r = 0; r < xs.size(); ++r) {
      std::copy(xs[r].x, xs[r].x + in_features, b.x.row(r));
      b.y.push_back(xs[r].y);
    }
    return b;
  }
};

// Flat copy of every parameter value, in parameters() order.
template <class Module>
std::vector<std::vector<float>> parameter_values(Module& m) {
  std::vector<std::vector<float>> out;
  for (auto& p : m.parameters()) {
    auto v = p.value.template as<float>();
    out.emplace_back(v.begin(), v.end());
  }
  return out;
}

// Every parameter as the module holds it, f32 or 16 bits widened to f32 (exactly).
template <class Module>
std::vector<std::vector<float>> held_values(Module& m) {
  std::vector<std::vector<float>> out;
  for (auto& p : m.parameters()) {
    std::vector<float> v(p.value.numel());
    if (p.value.type == ddp::dtype::f32) {
      const auto f = p.value.template as<float>();
      v.assign(f.begin(), f.end());
    } else {
      ddp::host::visit_half_dtype(p.value.type, [&]<class F>(F) {
        ddp::host::widen<F>(static_cast<const std::uint16_t*>(p.value.data), v.data(), v.size());
      });
    }
    out.push_back(std::move(v));
  }
  return out;
}

// Plain single-process SGD with momentum on a module's own gradients.
template <class Module>
class reference_sgd {
 public:
  reference_sgd(Module& m, ddp::optim::sgd o) : m_(m), o_(o) {
    for (auto& p : m_.parameters()) state_.emplace_back(p.value.numel(), 0.0f);
  }
  void step() {
    std::size_t i = 0;
    for (auto& p : m_.parameters()) {
      auto v = p.value.template as<float>();
      auto g = p.grad.template as<float>();
      ddp::host::rule_segment(v.data(), g.data(), state_[i++].data(), v.size(), o_.at(1));
      std::fill(g.begin(), g.end(), 0.0f);
    }
  }

 private:
  Module& m_;
  ddp::optim::sgd o_;
  std::vector<std::vector<float>> state_;
};

// Ten layers of 24 x 24 weights: one bucket each under bucket_cap<2400>, reduced while the
// layers before them compute.
using ddp::nn::linear, ddp::nn::relu;
using deep_mlp = ddp::nn::sequential<linear, relu, linear, relu, linear, relu, linear, relu, linear, relu, linear, relu,
                                     linear, relu, linear, relu, linear, relu, linear>;
inline deep_mlp make_deep_mlp() {
  constexpr std::size_t w = 24;
  return deep_mlp(linear(in_features, w, 1), relu(), linear(w, w, 2), relu(), linear(w, w, 3), relu(), linear(w, w, 4),
                  relu(), linear(w, w, 5), relu(), linear(w, w, 6), relu(), linear(w, w, 7), relu(), linear(w, w, 8),
                  relu(), linear(w, w, 9), relu(), linear(w, classes, 10));
}

}  // namespace test

namespace test {

// A module with an optional branch: out = trunk(x) + (use_aux ? aux(x) : 0). A rank that sets
// use_aux = false leaves aux.weight and aux.bias without gradient (pitfall P2).
class branchy {
 public:
  using input_type = ddp::nn::matrix;
  using output_type = ddp::nn::matrix;
  static constexpr bool reports_gradient_ready = true;

  explicit branchy(std::uint64_t seed)
      : trunk_(in_features, classes, seed), aux_(in_features, classes, seed + 7) {}

  bool use_aux = true;

  std::vector<ddp::parameter_ref> parameters() {
    std::vector<ddp::parameter_ref> refs;
    for (auto& p : trunk_.params()) refs.push_back(p.ref("trunk."));
    for (auto& p : aux_.params()) refs.push_back(p.ref("aux."));
    return refs;
  }
  std::vector<ddp::buffer_ref> buffers() { return {}; }

  ddp::nn::matrix forward(const ddp::nn::matrix& x) {
    auto y = trunk_.forward(x, true);
    if (use_aux) {
      auto a = aux_.forward(x, true);
      for (std::size_t i = 0; i < y.size(); ++i) y.data[i] += a.data[i];
    }
    tape_.push_back(use_aux);
    return y;
  }
  void backward(const ddp::nn::matrix& g, const ddp::ready_sink& ready) {
    const bool used_aux = ddp::nn::pop_saved(tape_, "branchy");
    if (used_aux) {
      aux_.backward(g, false);
      ready(2);
      ready(3);
    }
    trunk_.backward(g, false);
    ready(0);
    ready(1);
  }
  void bind_gradient(std::size_t i, float* storage) {
    (i < 2 ? trunk_.params()[i] : aux_.params()[i - 2]).bind_gradient(storage);
  }

 private:
  ddp::nn::linear trunk_, aux_;
  std::vector<char> tape_;
};

}  // namespace test
