#pragma once
// ddp::torch::module<Net>: a torch::nn::Module (a ModuleHolder such as torch::nn::Sequential or a
// TORCH_MODULE of your own, or a std::shared_ptr to the module) as a model of ddp's module
// concept, so a ddp::trainer trains it data-parallel with autograd doing the backward.
//
//   auto net = torch::nn::Sequential(torch::nn::Linear(784, 128), torch::nn::ReLU(), ...);
//   ddp::torch::module model(net);
//   ddp::trainer<decltype(model)> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.1f});
//   trainer.step([&](auto& replica) {
//     auto loss = torch::nn::functional::cross_entropy(replica.forward(x), y);
//     replica.backward(loss);            // loss.backward(), with ddp's bookkeeping around it
//   });
//
// - Parameters and buffers come from named_parameters() / named_buffers(), under their dotted
//   names ("conv1.weight", "bn.running_mean"): every ddp error names them as the net does.
// - Readiness comes from autograd: a post hook on each parameter's AccumulateGrad node reports
//   the parameter ready once its gradient is accumulated, so buckets reduce while backward
//   runs, and the unused-parameter policies see what autograd saw.
// - Gradients live in the trainer's bucket memory: each parameter's .grad() is a tensor over it,
//   and autograd accumulates into it in place (nothing is copied before a reduction). Leave
//   zeroing to the trainer; a zero_grad() that sets gradients to None is undone at the next
//   forward.
// - Pitfall P1 from torch's own version counters: a buffer the trainer overwrites (buffer sync)
//   has its version bumped before backward, so autograd checks what it saved, and its error
//   ("modified by an inplace operation") becomes ddp's, naming the buffer and the fix.
// - backward(t): t is the loss (a tensor in the graph: loss.backward()) or, for a tensor outside
//   the graph, the gradient of the innermost forward's output.
//
// Parameters must be f32, contiguous and on the CPU (Debian's libtorch is CPU-only; a CUDA
// libtorch would pair this adapter with the CUDA device and NCCL: see docs/torch.md).
#include <torch/torch.h>

#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/buffer_version.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/ready_sink.hpp"
#include "ddp/core/tensor.hpp"
#include "ddp/torch/autograd.hpp"

namespace ddp::torch {

namespace detail {

inline dtype dtype_of_tensor(const ::torch::Tensor& t, const std::string& name) {
  switch (t.scalar_type()) {
    case ::torch::kFloat: return dtype::f32;
    case ::torch::kDouble: return dtype::f64;
    case ::torch::kInt: return dtype::i32;
    case ::torch::kLong: return dtype::i64;
    case ::torch::kByte: return dtype::u8;
    case ::torch::kHalf: return dtype::f16;
    case ::torch::kBFloat16: return dtype::bf16;
    default: break;
  }
  throw error("torch", "module", -1,
              "'" + name + "' has dtype " + std::string(c10::toString(t.scalar_type())) +
                  ", which ddp does not carry; use float32 (parameters) or a float/integer buffer");
}

inline tensor_ref ref_of(const ::torch::Tensor& t, const std::string& name) {
  if (!t.device().is_cpu())
    throw error("torch", "module", -1,
                "'" + name + "' is on " + t.device().str() +
                    "; ddp::torch trains CPU tensors (move the net with net->to(torch::kCPU))");
  if (!t.is_contiguous())
    throw error("torch", "module", -1, "'" + name + "' is not contiguous; make it so before training");
  const auto sizes = t.sizes();
  return {t.data_ptr(), dtype_of_tensor(t, name), shape_t(sizes.begin(), sizes.end()), device_id::cpu()};
}

// What the autograd hooks reach: shared with them weakly, so a hook that outlives the adapter
// (the net is kept and trained elsewhere) does nothing.
struct hook_state {
  const ready_sink* ready = nullptr;  // set during backward
};

}  // namespace detail

template <class Net>
class module {
 public:
  using input_type = ::torch::Tensor;
  using output_type = ::torch::Tensor;
  static constexpr bool reports_gradient_ready = true;

  explicit module(Net net) : net_(std::move(net)), state_(std::make_shared<detail::hook_state>()) {
    for (const auto& item : net_->named_parameters(/*recurse=*/true)) {
      const auto& p = item.value();
      if (p.scalar_type() != ::torch::kFloat)
        throw error("torch", "module", -1,
                    "parameter '" + item.key() + "' is " + std::string(c10::toString(p.scalar_type())) +
                        "; ddp trains float32 parameters (net->to(torch::kFloat32))");
      (void)detail::ref_of(p, item.key());  // device and layout checked once, here
      params_.push_back({item.key(), p});
    }
    for (const auto& item : net_->named_buffers(/*recurse=*/true)) {
      (void)detail::ref_of(item.value(), item.key());
      buffers_.push_back({item.key(), item.value(), 0});
    }
    versions_.resize(buffers_.size());
    std::weak_ptr<detail::hook_state> weak = state_;
    for (std::size_t i = 0; i < params_.size(); ++i)
      accumulators_.push_back(detail::after_gradient_accumulated(params_[i].tensor, [weak, i] {
        if (auto s = weak.lock(); s && s->ready) (*s->ready)(i);
      }));
  }
  module(const module&) = delete;
  module& operator=(const module&) = delete;
  module(module&&) noexcept = default;

  Net& net() noexcept { return net_; }
  void train(bool on = true) { net_->train(on); }
  void eval() { net_->train(false); }
  bool training() const { return net_->is_training(); }

  std::vector<parameter_ref> parameters() {
    std::vector<parameter_ref> refs;
    for (auto& p : params_) {
      ensure_gradient(p);
      refs.push_back({p.name, detail::ref_of(p.tensor, p.name), detail::ref_of(p.tensor.grad(), p.name)});
    }
    return refs;
  }
  std::vector<buffer_ref> buffers() {
    std::vector<buffer_ref> refs;
    for (std::size_t i = 0; i < buffers_.size(); ++i)
      refs.push_back({buffers_[i].name, detail::ref_of(buffers_[i].tensor, buffers_[i].name), &versions_[i]});
    return refs;
  }

  // The gradient of parameter i is a tensor over `storage` from now on (nullptr: its own again).
  void bind_gradient(std::size_t i, float* storage) {
    auto& p = params_.at(i);
    ensure_gradient(p);
    if (!storage) {
      p.tensor.mutable_grad() = p.tensor.grad().clone();
      p.bound = nullptr;
      return;
    }
    auto view = ::torch::from_blob(storage, p.tensor.sizes(), p.tensor.options().requires_grad(false));
    view.copy_(p.tensor.grad());
    p.tensor.mutable_grad() = view;
    p.bound = storage;
  }

  output_type forward(const input_type& x) {
    publish_versions();  // the trainer synchronised buffers just before: autograd saves them as they are now
    for (auto& p : params_) rebind(p);
    if (!net_->is_training()) {  // evaluation: no graph, nothing saved for a backward
      ::torch::NoGradGuard no_grad;
      return net_->forward(x);
    }
    auto y = net_->forward(x);
    if (net_->is_training()) {
      std::vector<std::uint64_t> seen;
      for (const auto& v : versions_) seen.push_back(v.value());
      tape_.push_back({y, std::move(seen)});
    }
    return y;
  }

  void backward(const output_type& t, const ready_sink& ready) {
    if (tape_.empty())
      throw error("torch", "backward", -1, "backward without a training forward (net in eval mode, or one "
                                           "backward too many)");
    const auto entry = std::move(tape_.back());
    tape_.pop_back();
    publish_versions();
    state_->ready = &ready;
    try {
      if (t.requires_grad())
        t.backward();  // the loss
      else
        entry.output.backward(t);  // the gradient of this forward's output
    } catch (const c10::Error& e) {
      state_->ready = nullptr;
      throw translate(e, entry);
    }
    state_->ready = nullptr;
  }

 private:
  struct parameter_slot {
    std::string name;
    ::torch::Tensor tensor;
    float* bound = nullptr;  // the trainer's storage of its gradient, when bound
  };
  struct buffer_slot {
    std::string name;
    ::torch::Tensor tensor;
    std::uint64_t published = 0;  // ddp version already passed on to torch's counter
  };
  struct tape_entry {
    ::torch::Tensor output;
    std::vector<std::uint64_t> versions;  // ddp's buffer versions after this forward
  };

  static void ensure_gradient(parameter_slot& p) {
    if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = ::torch::zeros_like(p.tensor);
  }
  // A zero_grad() that set the gradient to None (libtorch 2.x's default) dropped the binding.
  static void rebind(parameter_slot& p) {
    if (!p.bound || (p.tensor.grad().defined() && p.tensor.grad().data_ptr() == p.bound)) return;
    auto view = ::torch::from_blob(p.bound, p.tensor.sizes(), p.tensor.options().requires_grad(false));
    if (p.tensor.grad().defined()) view.copy_(p.tensor.grad());
    else view.zero_();
    p.tensor.mutable_grad() = view;
  }

  // The trainer's writes into buffers (buffer sync) bump ddp's version; torch learns of them here.
  void publish_versions() {
    for (std::size_t i = 0; i < buffers_.size(); ++i)
      for (; buffers_[i].published < versions_[i].value(); ++buffers_[i].published)
        detail::bump_version(buffers_[i].tensor);
  }

  error translate(const c10::Error& e, const tape_entry& entry) const {
    const std::string what = e.what_without_backtrace();
    if (what.find("modified by an inplace operation") == std::string::npos)
      return error("torch", "backward", -1, what);
    std::string names;
    for (std::size_t i = 0; i < buffers_.size(); ++i)
      if (versions_[i].value() != entry.versions[i])
        names += (names.empty() ? "'" : ", '") + buffers_[i].name + "'";
    if (names.empty())
      return error("torch", "backward", -1, "a tensor this backward needs was modified in place after its forward "
                                            "(not by ddp): " + what);
    return error("torch", "backward", -1,
                 "buffer " + names + " was overwritten by the trainer's buffer synchronisation after the forward "
                 "whose backward reads it (pitfall P1; torch: " + what.substr(0, what.find('\n')) +
                 "). Use buffer_sync::broadcast_once_per_step (one sync before the step's first forward), or run "
                 "one forward per step");
  }

  Net net_;
  std::shared_ptr<detail::hook_state> state_;
  std::vector<parameter_slot> params_;
  std::vector<buffer_slot> buffers_;
  std::deque<buffer_version> versions_;  // stable addresses: buffer_refs point at them
  std::vector<std::shared_ptr<::torch::autograd::Node>> accumulators_;
  std::vector<tape_entry> tape_;
};

template <class Net>
module(Net) -> module<Net>;

}  // namespace ddp::torch
