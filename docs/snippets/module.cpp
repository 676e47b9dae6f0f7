// The snippets of docs/writing-a-module.md, docs/concepts/module.md, docs/nn.md and README.md,
// compiled; the module of writing-a-module.md is also trained for a step, so its members are
// instantiated.
#include "common.hpp"

#include <ddp/nn/check_gradients.hpp>
#include <ddp/nn/embedding.hpp>
#include <ddp/nn/gelu.hpp>
#include <ddp/nn/layer.hpp>
#include <ddp/nn/layer_norm.hpp>
#include <ddp/nn/parameter.hpp>
#include <ddp/nn/residual.hpp>

namespace snippets {

// [doc: writing-a-module.md]
#include <ddp/ddp.hpp>
#include <ddp/nn/layer.hpp>
#include <ddp/nn/matrix.hpp>
#include <ddp/nn/parameter.hpp>

// y = x·Wᵀ + b: a linear head written by hand.
class my_head {
 public:
  using input_type = ddp::nn::matrix;
  using output_type = ddp::nn::matrix;
  static constexpr bool reports_gradient_ready = true;   // I call ready(i) in backward

  my_head(std::size_t in, std::size_t out)
      : in_(in), out_(out), w_("weight", {std::int64_t(out), std::int64_t(in)}), b_("bias", {std::int64_t(out)}) {
    for (std::size_t i = 0; i < w_.value().size(); ++i) w_.value()[i] = 0.01f * float(i % 7);
  }

  std::vector<ddp::parameter_ref> parameters() {          // stable order and storage
    return {w_.ref("head."), b_.ref("head.")};            // ddp::nn::parameter does the views
  }
  std::vector<ddp::buffer_ref> buffers() { return {}; }

  output_type forward(const input_type& x) {
    if (training_) saved_.push_back(x);                   // what backward will need
    output_type y(x.rows, out_);
    for (std::size_t r = 0; r < x.rows; ++r)
      for (std::size_t o = 0; o < out_; ++o) {
        float s = b_.value()[o];
        for (std::size_t i = 0; i < in_; ++i) s += x(r, i) * w_.value()[o * in_ + i];
        y(r, o) = s;
      }
    return y;
  }
  void backward(const output_type& g, const ddp::ready_sink& ready) {
    const auto x = ddp::nn::pop_saved(saved_, "my_head");  // innermost forward first
    for (std::size_t r = 0; r < x.rows; ++r)              // += : gradients accumulate
      for (std::size_t o = 0; o < out_; ++o) {
        b_.grad()[o] += g(r, o);
        for (std::size_t i = 0; i < in_; ++i) w_.grad()[o * in_ + i] += g(r, o) * x(r, i);
      }
    ready(0); ready(1);                                   // both final: reduce them now
  }

  // Evaluation mode: forward saves nothing (trainer.evaluate switches to it and back).
  void train(bool on = true) { training_ = on; }
  void eval() { training_ = false; }
  bool training() const { return training_; }

  void bind_gradient(std::size_t i, float* storage) {    // optional: no copies
    (i == 0 ? w_ : b_).bind_gradient(storage);            // nullptr: take your own storage back
  }
  void bind_parameter(std::size_t i, float* storage) {   // optional: no copies under
    (i == 0 ? w_ : b_).bind_value(storage);               // update::sharded
  }

 private:
  std::size_t in_, out_;
  ddp::nn::parameter w_, b_;
  std::vector<ddp::nn::matrix> saved_;
  bool training_ = true;
};
static_assert(ddp::trainable_module<my_head>);
// [end doc]

// The views a module returns, read as a program that hashes a trained model would.
std::uint64_t parameter_hash(my_head& module) {
  // [doc: writing-a-module.md]
  #include <ddp/ddp.hpp>
  #include <cstdint>

  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over every parameter's bytes, in order
  for (const ddp::parameter_ref& p : module.parameters()) {
    const auto* b = static_cast<const unsigned char*>(p.value.data);  // host memory (a CPU module)
    for (std::size_t i = 0; i < p.value.bytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  const std::span<const float> w = module.parameters()[0].value.as<const float>();  // an f32 parameter
  // [end doc]
  return h ^ static_cast<std::uint64_t>(w.size());
}

// [doc: concepts/module.md]
#include <ddp/ddp.hpp>
#include <ddp/nn/matrix.hpp>

struct minimal_module {   // the members the trainer calls, and nothing else
  using input_type = ddp::nn::matrix;                       // any types your forward takes
  using output_type = ddp::nn::matrix;                      // and returns
  std::vector<ddp::parameter_ref> parameters();             // name, value, gradient (f32, bf16 or f16)
  std::vector<ddp::buffer_ref> buffers();                   // name, tensor, &version (running stats, counters)
  output_type forward(const input_type& x);                 // in training: pushes what backward needs
  void backward(const output_type& grad_output, const ddp::ready_sink& ready);
};
static_assert(ddp::trainable_module<minimal_module>);
// [end doc]

void readme(const loader_type& loader, std::uint64_t seed) {
  // [doc: README.md]
  #include <ddp/ddp.hpp>                 // the trainer, its policies, in-process ranks, the host device
  #include <ddp/nn/cross_entropy.hpp>   // the reference layers' loss (link ddp::nn)

  using trainer_t = ddp::trainer<model, ddp::buffer_sync::broadcast_once_per_step,
                                 ddp::unused_params::detect_each_step, ddp::optim::sgd>;
  ddp::inproc::launch(2, [&](ddp::inproc::communicator& comm) {
    auto m = make_model(seed);
    ddp::host::device dev;
    trainer_t trainer(m, comm, dev, ddp::optim::sgd{.lr = 0.1f, .momentum = 0.9f});
    for (const auto& batch : trainer.epoch(loader))
      trainer.step([&](auto& replica) {
        auto ce = ddp::nn::softmax_cross_entropy(replica.forward(batch.x), batch.y, batch.weights);
        replica.backward(ce.grad);
      });
  });
  // [end doc]
}

// [doc: writing-a-module.md]
#include <ddp/ddp.hpp>
#include <ddp/nn/embedding.hpp>
#include <ddp/nn/linear.hpp>
#include <ddp/nn/relu.hpp>
#include <ddp/nn/sequential.hpp>

// Token ids -> rows of a table -> an MLP. Parameter 0 is the table; the MLP's follow.
class token_classifier {
 public:
  using input_type = std::vector<std::int32_t>;           // one token per sample
  using output_type = ddp::nn::matrix;
  static constexpr bool reports_gradient_ready = true;

  token_classifier(std::size_t vocabulary, std::uint64_t seed)
      : embed_(vocabulary, 32, seed),
        mlp_(ddp::nn::linear(32, 64, seed + 1), ddp::nn::relu(), ddp::nn::linear(64, 4, seed + 2)) {
    mlp_.compute_input_gradient();                        // the table's gradient needs d loss / d rows
  }

  std::vector<ddp::parameter_ref> parameters() {
    std::vector<ddp::parameter_ref> refs{embed_.params()[0].ref("embed.")};
    for (auto p : mlp_.parameters()) {
      p.name = "mlp." + p.name;
      refs.push_back(p);
    }
    return refs;
  }
  std::vector<ddp::buffer_ref> buffers() { return {}; }

  output_type forward(const input_type& ids) { return mlp_.forward(embed_.forward(ids, mlp_.training())); }
  void backward(const output_type& g, const ddp::ready_sink& ready) {
    auto shifted = [&](std::size_t i) { ready(i + 1); };  // the MLP's index i is this module's i + 1
    embed_.backward(mlp_.backward(g, ddp::ready_sink(shifted)));
    ready(0);
  }
  void train(bool on = true) { mlp_.train(on); }
  void eval() { mlp_.eval(); }
  bool training() const { return mlp_.training(); }

  void bind_gradient(std::size_t i, float* storage) {
    if (i == 0) embed_.params()[0].bind_gradient(storage);
    else mlp_.bind_gradient(i - 1, storage);
  }

 private:
  ddp::nn::embedding embed_;
  ddp::nn::sequential<ddp::nn::linear, ddp::nn::relu, ddp::nn::linear> mlp_;
};
static_assert(ddp::trainable_module<token_classifier>);
// [end doc]

// [doc: nn.md]
#include <ddp/nn/check_gradients.hpp>
#include <ddp/nn/gelu.hpp>
#include <ddp/nn/layer_norm.hpp>
#include <ddp/nn/linear.hpp>
#include <ddp/nn/residual.hpp>
#include <ddp/nn/sequential.hpp>

// A pre-norm residual MLP: x + W2·gelu(W1·layer_norm(x)) between an input and an output layer.
inline auto residual_mlp(std::uint64_t seed) {
  using namespace ddp::nn;
  return sequential(linear(784, 256, seed),
                    residual(layer_norm(256), linear(256, 512, seed + 1), gelu(), linear(512, 256, seed + 2)),
                    layer_norm(256), linear(256, 10, seed + 3));
}

// Its backward against finite differences on a small batch: 64 elements of each tensor.
inline void check_residual_mlp() {
  auto model = residual_mlp(1);
  ddp::nn::matrix x(4, 784, 0.5f);
  ddp::nn::gradient_check_options options;
  options.max_elements = 64;
  ddp::nn::check_gradients(model, x, options).throw_if_failed();
}
// [end doc]

// One step of my_head, so its members compile as the trainer calls them.
void train_my_head() {
  ddp::inproc::launch(1, [](ddp::inproc::communicator& comm) {
    my_head head(4, 3);
    ddp::host::device dev;
    ddp::trainer<my_head> trainer(head, comm, dev);
    ddp::nn::matrix x(2, 4);
    const std::vector<std::int32_t> y{0, 2};
    trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(x), y).grad); });
  });
}

}  // namespace snippets
