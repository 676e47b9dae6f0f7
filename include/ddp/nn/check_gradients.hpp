#pragma once
// A module's backward against central finite differences of its forward, on the host.
//
//   auto report = ddp::nn::check_gradients(model, x);     // a module or a layer, and its input
//   if (!report) std::cerr << report.message();            // or report.throw_if_failed();
//
// The loss is L = sum(w . forward(input)) with w a fixed random matrix (from options.seed), so
// one backward of w gives every analytic gradient. Each checked element v (every parameter
// element, and every input element when the input is a ddp::nn::matrix) is moved to v + h and
// v - h, h = step * max(1, |v|), and (L(v + h) - L(v - h)) / (the two values' difference) is
// compared with the analytic one, the loss summed in double. An element disagrees when
// |analytic - numeric| > absolute_tolerance + relative_tolerance * max(|analytic|, |numeric|).
//
// What it needs: f32 parameters in host memory; a forward that is a function of its input and
// parameters (dropout off: each forward draws a new mask). It runs two training forwards (and
// backwards of zeros, which add nothing) per checked element, so layers with running statistics
// (batch_norm) move them; it turns a module's compute_input_gradient() on to check the input.
// Gradients accumulated before the call are kept. A second backward of the same loss must add to
// the gradients (the module concept's +=, which micro-batches rely on): a parameter whose gradient
// it does not double is named (`not_accumulated`).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ddp/concepts/module.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/random.hpp"
#include "ddp/nn/matrix.hpp"

namespace ddp::nn {

struct gradient_check_options {
  double step = 1e-2;                 // h = step * max(1, |v|)
  double relative_tolerance = 1e-2;
  double absolute_tolerance = 1e-3;
  std::size_t max_elements = 0;       // per tensor: 0 checks every element, else a seeded sample of this many
  std::uint64_t seed = 1;             // the loss's weights and the sample
  bool check_input = true;            // when the input is a ddp::nn::matrix
};

struct gradient_mismatch {
  std::string tensor;  // "input", or the parameter's name
  shape_t shape;
  std::size_t element = 0;  // flat, row-major
  double analytic = 0.0, numeric = 0.0;

  // "0.weight[2, 5]": the tensor and the element's index in each dimension.
  std::string where() const {
    std::vector<std::size_t> index(shape.size());
    std::size_t rest = element;
    for (std::size_t d = shape.size(); d-- > 0;) {
      const auto extent = static_cast<std::size_t>(std::max<std::int64_t>(shape[d], 1));
      index[d] = rest % extent;
      rest /= extent;
    }
    std::string s = tensor + "[";
    for (std::size_t d = 0; d < index.size(); ++d) s += (d ? ", " : "") + std::to_string(index[d]);
    return s + "]";
  }
};

struct gradient_check_report {
  std::size_t checked = 0;                  // elements compared
  std::vector<gradient_mismatch> mismatches;
  std::vector<std::string> not_accumulated;  // parameters whose second backward did not add to the first
  double largest_difference = 0.0;          // the largest |analytic - numeric| among the checked
  gradient_check_options options;

  bool passed() const noexcept { return mismatches.empty() && not_accumulated.empty(); }
  explicit operator bool() const noexcept { return passed(); }

  std::string message() const {
    if (passed())
      return "ddp::nn::check_gradients: all " + std::to_string(checked) + " elements agree (largest difference " +
             std::to_string(largest_difference) + ")";
    if (!not_accumulated.empty()) {
      std::string s = "ddp::nn::check_gradients: a second backward did not add to the first gradient of";
      for (const auto& name : not_accumulated) s += " '" + name + "'";
      s += ": backward must accumulate (+=) into every parameter's gradient, never assign it (micro-batches and "
           "several forwards per step add their gradients there)";
      return mismatches.empty() ? s : s + "\n" + mismatch_message();
    }
    return mismatch_message();
  }
  std::string mismatch_message() const {
    std::string s = "ddp::nn::check_gradients: " + std::to_string(mismatches.size()) + " of " +
                    std::to_string(checked) + " elements disagree beyond " +
                    std::to_string(options.absolute_tolerance) + " + " + std::to_string(options.relative_tolerance) +
                    " * |gradient|:";
    const std::size_t shown = std::min<std::size_t>(mismatches.size(), 10);
    for (std::size_t i = 0; i < shown; ++i)
      s += "\n  " + mismatches[i].where() + ": analytic " + std::to_string(mismatches[i].analytic) + ", numeric " +
           std::to_string(mismatches[i].numeric);
    if (shown < mismatches.size()) s += "\n  ... and " + std::to_string(mismatches.size() - shown) + " more";
    return s;
  }
  void throw_if_failed() const {
    if (!passed()) throw error("nn", "check_gradients", -1, message());
  }
};

namespace detail {

// A layer (forward(x, training), backward(dy, need_dx), params()) or a module (forward(x),
// backward(g, ready_sink), parameters()), driven alike.
template <class M, class Input>
concept checkable_layer = requires(M& m, const Input& x, const matrix& dy) {
  { m.forward(x, true) } -> std::same_as<matrix>;
  m.backward(dy, true);
  m.params();
};

template <class M, class Input>
class gradient_driver {
  static_assert(checkable_layer<M, Input> || trainable_module<M>,
                "ddp::nn::check_gradients: the object is neither a layer (forward(x, training), backward(dy, "
                "need_dx), params()) nor a module (ddp::trainable_module)");

 public:
  explicit gradient_driver(M& m, bool want_input_gradient) : m_(m) {
    if constexpr (!checkable_layer<M, Input>) {
      if constexpr (requires { m.training(); m.train(true); }) {
        was_training_ = m.training();
        m.train(true);
      }
      if constexpr (requires { m.compute_input_gradient(true); })
        if (want_input_gradient) m.compute_input_gradient(true);
    }
  }
  ~gradient_driver() {
    if constexpr (!checkable_layer<M, Input>)
      if constexpr (requires { m_.train(true); }) m_.train(was_training_);
  }
  gradient_driver(const gradient_driver&) = delete;
  gradient_driver& operator=(const gradient_driver&) = delete;

  std::vector<parameter_ref> parameters() {
    std::vector<parameter_ref> refs;
    if constexpr (checkable_layer<M, Input>) {
      for (auto& p : m_.params()) refs.push_back(p.ref(""));
    } else {
      for (auto&& p : m_.parameters()) refs.push_back(p);
    }
    return refs;
  }
  matrix forward(const Input& x) {
    if constexpr (checkable_layer<M, Input>) return m_.forward(x, true);
    else return matrix(m_.forward(x));
  }
  // The gradient with respect to the input, or an empty matrix when there is none.
  matrix backward(const matrix& dy) {
    if constexpr (checkable_layer<M, Input>) {
      if constexpr (std::is_same_v<decltype(m_.backward(dy, true)), matrix>) return m_.backward(dy, true);
      else return m_.backward(dy, true), matrix{};
    } else {
      if constexpr (std::is_convertible_v<decltype(m_.backward(dy, ready_sink{})), matrix>)
        return m_.backward(dy, ready_sink{});
      else return m_.backward(dy, ready_sink{}), matrix{};
    }
  }

 private:
  M& m_;
  bool was_training_ = true;
};

// `count` distinct elements of [0, n), ascending; all of them when count is 0 or at least n.
inline std::vector<std::size_t> sample_elements(std::size_t n, std::size_t count, splitmix64& rng) {
  std::vector<std::size_t> all(n);
  for (std::size_t i = 0; i < n; ++i) all[i] = i;
  if (count == 0 || count >= n) return all;
  for (std::size_t i = 0; i < count; ++i) std::swap(all[i], all[i + rng.below(n - i)]);
  all.resize(count);
  std::sort(all.begin(), all.end());
  return all;
}

// What the check needs of a module, type-erased so that its loops are compiled once.
struct gradient_problem {
  std::vector<parameter_ref> parameters;
  matrix* input = nullptr;                         // moved in place when checked; null: not checked
  std::function<matrix()> forward;                 // a training forward of the input and the parameters
  std::function<matrix(const matrix&)> backward;   // its backward: d loss / d input, or an empty matrix
};

inline gradient_check_report check_gradients(const gradient_problem& problem, const gradient_check_options& options) {
  const auto& refs = problem.parameters;
  for (const auto& p : refs) {
    if (p.value.device != device_id::cpu() || p.grad.device != device_id::cpu())
      throw error("nn", "check_gradients", -1,
                  "parameter '" + p.name + "' is on " + p.value.device.to_string() +
                      "; the check runs on the host: check the host twin of the layer, and compare the device's "
                      "outputs with it");
    if (p.value.type != dtype::f32 || p.grad.type != dtype::f32)
      throw error("nn", "check_gradients", -1,
                  "parameter '" + p.name + "' is " + std::string(name_of(p.value.type)) +
                      "; the check needs f32 parameters: cast(ddp::dtype::f32) first");
  }

  // The analytic gradients, from zero; what was accumulated before is put back at the end.
  std::vector<std::vector<float>> kept, analytic;
  for (const auto& p : refs) {
    auto g = p.grad.as<float>();
    kept.emplace_back(g.begin(), g.end());
    std::fill(g.begin(), g.end(), 0.0f);
  }
  const matrix y0 = problem.forward();
  splitmix64 rng(options.seed);
  matrix w(y0.rows, y0.cols);
  for (auto& v : w.data) v = rng.uniform(-1.0f, 1.0f);
  const matrix dx = problem.backward(w);
  for (const auto& p : refs) {
    auto g = p.grad.as<float>();
    analytic.emplace_back(g.begin(), g.end());
  }
  gradient_check_report report;
  report.options = options;
  (void)problem.forward();  // the same loss again: its backward must add as much again
  (void)problem.backward(w);
  for (std::size_t k = 0; k < refs.size(); ++k) {
    const auto g = refs[k].grad.as<float>();
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double twice = 2.0 * analytic[k][i];
      if (std::abs(g[i] - twice) > options.absolute_tolerance + options.relative_tolerance * std::abs(twice)) {
        report.not_accumulated.push_back(refs[k].name);
        break;
      }
    }
  }
  const matrix zero(y0.rows, y0.cols);
  auto loss = [&] {
    const matrix y = problem.forward();
    if (y.rows != w.rows || y.cols != w.cols)
      throw error("nn", "check_gradients", -1,
                  "the forward's output changed shape between calls (" + std::to_string(w.rows) + " x " +
                      std::to_string(w.cols) + ", then " + std::to_string(y.rows) + " x " + std::to_string(y.cols) +
                      "); the check needs a forward that depends on its input and parameters only");
    (void)problem.backward(zero);  // pops what the forward saved; adds nothing
    double s = 0.0;
    for (std::size_t i = 0; i < y.size(); ++i) s += static_cast<double>(w.data[i]) * y.data[i];
    return s;
  };

  // Moves v to v + h and v - h; the numeric derivative over the two stored values' difference.
  auto compare = [&](float& v, double exact, const std::string& name, const shape_t& shape, std::size_t i) {
    const float keep = v;
    const double h = options.step * std::max(1.0, std::abs(static_cast<double>(keep)));
    const float up = static_cast<float>(keep + h), down = static_cast<float>(keep - h);
    v = up;
    const double l_up = loss();
    v = down;
    const double l_down = loss();
    v = keep;
    const double numeric = (l_up - l_down) / (static_cast<double>(up) - static_cast<double>(down));
    const double diff = std::abs(numeric - exact);
    report.largest_difference = std::max(report.largest_difference, diff);
    ++report.checked;
    if (!(diff <= options.absolute_tolerance + options.relative_tolerance * std::max(std::abs(exact), std::abs(numeric))))
      report.mismatches.push_back({name, shape, i, exact, numeric});
  };

  if (matrix* x = problem.input) {
    if (dx.rows != x->rows || dx.cols != x->cols)
      throw error("nn", "check_gradients", -1,
                  "the backward returned no gradient of the input's shape (" + std::to_string(dx.rows) + " x " +
                      std::to_string(dx.cols) + " for an input of " + std::to_string(x->rows) + " x " +
                      std::to_string(x->cols) + "); return d loss / d input from backward, or set check_input = false");
    const shape_t shape{static_cast<std::int64_t>(x->rows), static_cast<std::int64_t>(x->cols)};
    for (const std::size_t i : sample_elements(x->size(), options.max_elements, rng))
      compare(x->data[i], dx.data[i], "input", shape, i);
  }
  for (std::size_t k = 0; k < refs.size(); ++k) {
    auto v = refs[k].value.as<float>();
    for (const std::size_t i : sample_elements(v.size(), options.max_elements, rng))
      compare(v[i], analytic[k][i], refs[k].name, refs[k].value.shape, i);
  }
  for (std::size_t k = 0; k < refs.size(); ++k) {
    auto g = refs[k].grad.as<float>();
    std::copy(kept[k].begin(), kept[k].end(), g.begin());
  }
  return report;
}

}  // namespace detail

template <class M, class Input>
gradient_check_report check_gradients(M& module, const Input& input, const gradient_check_options& options = {}) {
  constexpr bool matrix_input = std::is_same_v<Input, matrix>;
  const bool check_input = matrix_input && options.check_input;
  detail::gradient_driver<M, Input> d(module, check_input);
  detail::gradient_problem problem{d.parameters(), nullptr, {}, [&](const matrix& dy) { return d.backward(dy); }};
  if constexpr (matrix_input) {
    matrix x = input;
    if (check_input) problem.input = &x;
    problem.forward = [&] { return d.forward(x); };
    return detail::check_gradients(problem, options);
  } else {
    problem.forward = [&] { return d.forward(input); };
    return detail::check_gradients(problem, options);
  }
}

}  // namespace ddp::nn
