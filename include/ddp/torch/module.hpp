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
//   A parameter that does not require a gradient (frozen) is left out: not trained, not
//   broadcast, so build it the same on every rank (build_seeded, or the same checkpoint).
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
// - update::sharded_gradients (any net): a hook on each parameter tells the trainer just before
//   autograd accumulates its gradient, and the trainer places the gradient in bucket memory then;
//   between a bucket's reduction and the next backward the parameter has no .grad().
// - update::fully_sharded (a torch::nn::Sequential): the adapter runs the Sequential's layers one
//   by one with the trainer's layer hooks around each forward, a hook on each layer's output for
//   its backward, and the parameters' storage objects pointed at the gathered bucket memory (and
//   at nothing between steps and outside their layer: trainer.gather_parameters() first, to read
//   them). Other nets have no place_parameter(), and such a trainer is a compile error naming it.
//
// Parameters must be f32, contiguous and on the CPU (Debian's libtorch is CPU-only; a CUDA
// libtorch would pair this adapter with the CUDA device and NCCL: see docs/torch.md).
#include <torch/torch.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/buffer_version.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/layer_hooks.hpp"
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
  layer_hooks* hooks = nullptr;       // the trainer's, while it places gradients or values
  // A Sequential run layer by layer: layer k holds parameters [first[k], first[k] + count[k]).
  std::vector<std::size_t> first, count, layer_of;
  std::vector<std::size_t> through;  // per layer: its parameters accumulated in this backward

  // Parameter i's gradient is accumulated: its layer's backward is done with it.
  void accumulated(std::size_t i) {
    if (hooks && !layer_of.empty()) {
      const std::size_t k = layer_of[i];
      if (++through[k] == count[k]) {
        through[k] = 0;
        hooks->after_backward(first[k], count[k]);
      }
    }
    if (ready) (*ready)(i);
  }
};

template <class Net>
concept sequential_net = std::same_as<std::remove_cvref_t<decltype(*std::declval<Net&>())>, ::torch::nn::SequentialImpl>;

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
      if (p.requires_grad()) params_.push_back({item.key(), p});
      else frozen_.push_back({item.key(), p});
    }
    for (const auto& item : net_->named_buffers(/*recurse=*/true)) {
      (void)detail::ref_of(item.value(), item.key());
      buffers_.push_back({item.key(), item.value(), 0});
    }
    versions_.resize(buffers_.size());
    std::weak_ptr<detail::hook_state> weak = state_;
    for (std::size_t i = 0; i < params_.size(); ++i)
      accumulators_.push_back(detail::after_gradient_accumulated(params_[i].tensor, [weak, i] {
        if (auto s = weak.lock()) s->accumulated(i);
      }));
    if constexpr (detail::sequential_net<Net>) find_layers();
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
      if (!p.placed) ensure_gradient(p);
      const auto sizes = p.tensor.sizes();
      const shape_t shape(sizes.begin(), sizes.end());
      refs.push_back({p.name,
                      detail::storage_floats(p.tensor) ? detail::ref_of(p.tensor, p.name)
                                                       : tensor_ref{nullptr, dtype::f32, shape, device_id::cpu()},
                      p.placed ? tensor_ref{p.placed_at, dtype::f32, shape, device_id::cpu()}
                               : detail::ref_of(p.tensor.grad(), p.name)});
    }
    return refs;
  }
  std::vector<buffer_ref> buffers() {
    std::vector<buffer_ref> refs;
    for (std::size_t i = 0; i < buffers_.size(); ++i)
      refs.push_back({buffers_[i].name, detail::ref_of(buffers_[i].tensor, buffers_[i].name), &versions_[i]});
    return refs;
  }

  // The gradient of parameter i is a tensor over `storage` from now on (nullptr: its own again;
  // zeros where it was placed nowhere).
  void bind_gradient(std::size_t i, float* storage) {
    auto& p = params_.at(i);
    p.placed = false;
    p.placed_at = nullptr;
    ensure_gradient(p);
    if (!storage) {
      p.tensor.mutable_grad() = p.tensor.grad().clone();
      p.bound = nullptr;
      return;
    }
    auto view = over(storage, p.tensor);
    view.copy_(p.tensor.grad());
    p.tensor.mutable_grad() = view;
    p.bound = storage;
  }
  // The value of parameter i lives at `storage` from now on, its contents copied there (nullptr:
  // in memory of its own again; zeros where it was placed nowhere). The parameter keeps its
  // storage object, so tensors that share it (w.detach(), a view) follow it there and back.
  void bind_parameter(std::size_t i, float* storage) {
    auto& p = params_.at(i);
    make_storage_alone(p);
    const float* now = detail::storage_floats(p.tensor);
    if (!storage) {
      if (!p.value_owned) detail::own_storage(p.tensor, now);
      p.value_owned = true;
      return;
    }
    if (!now) std::memset(storage, 0, bytes_of(p));
    else if (now != storage) std::memcpy(storage, now, bytes_of(p));
    detail::point_storage(p.tensor, storage);
    p.value_owned = false;
  }
  // Layer by layer (update::sharded_gradients, update::fully_sharded: ddp/concepts/module.hpp).
  void set_layer_hooks(layer_hooks* hooks) {
    if (hooks && !gradient_hooks_) {  // each parameter's gradient placed just before autograd adds to it
      std::weak_ptr<detail::hook_state> weak = state_;
      for (std::size_t i = 0; i < params_.size(); ++i)
        if (params_[i].tensor.requires_grad())
          params_[i].tensor.register_hook([weak, i](const ::torch::Tensor&) {
            if (auto s = weak.lock(); s && s->hooks) s->hooks->before_backward(i, 1);
          });
      gradient_hooks_ = true;
    }
    state_->hooks = hooks;
    if (!hooks) values_placed_ = false;
  }
  // Parameter i's gradient is a tensor over `storage` as it is there (nullptr: it has none).
  void place_gradient(std::size_t i, float* storage) {
    auto& p = params_.at(i);
    p.placed = true;
    p.placed_at = storage;
    p.bound = nullptr;
    p.tensor.mutable_grad() = storage ? over(storage, p.tensor) : ::torch::Tensor();
  }
  // Parameter i's value is what is at `storage` (nullptr: nowhere, its memory gone). Only a
  // Sequential, whose layers the adapter runs one by one with the hooks around them.
  void place_parameter(std::size_t i, float* storage)
    requires detail::sequential_net<Net>
  {
    auto& p = params_.at(i);
    if (state_->layer_of.empty())
      throw error("torch", "module", -1,
                  "parameter '" + p.name + "' cannot be placed layer by layer: " + layers_unknown_ +
                      "; update::fully_sharded needs every parameter in exactly one of the Sequential's layers");
    make_storage_alone(p);
    detail::point_storage(p.tensor, storage);
    p.value_owned = false;
    values_placed_ = true;
  }

  output_type forward(const input_type& x) {
    publish_versions();  // the trainer synchronised buffers just before: autograd saves them as they are now
    for (auto& p : params_) rebind(p);
    for (const auto& f : frozen_)
      if (f.tensor.requires_grad())
        throw error("torch", "forward", -1,
                    "parameter '" + f.name + "' did not require a gradient when the ddp::torch::module was made, and "
                    "now does: the trainer reduces the gradients of the parameters it was built with only, so this "
                    "one would train on each rank's own batch; make the module and its trainer after unfreezing it");
    if (!net_->is_training()) {  // evaluation: no graph, nothing saved for a backward
      ::torch::NoGradGuard no_grad;
      return run(x);
    }
    auto y = run(x);
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
    std::fill(state_->through.begin(), state_->through.end(), std::size_t{0});
    // The sink lives for this call only: forgotten on every way out, a ddp error thrown from a
    // hook (passed through autograd as it is) included.
    struct forget_sink {
      detail::hook_state* state;
      ~forget_sink() { state->ready = nullptr; }
    } forget{state_.get()};
    state_->ready = &ready;
    try {
      if (t.requires_grad())
        t.backward();  // the loss
      else
        entry.output.backward(t);  // the gradient of this forward's output
    } catch (const c10::Error& e) {
      throw translate(e, entry);
    }
  }

 private:
  struct parameter_slot {
    std::string name;
    ::torch::Tensor tensor;
    float* bound = nullptr;      // the trainer's storage of its gradient, when bound
    bool placed = false;         // its gradient placed by the trainer, at placed_at (or nowhere)
    float* placed_at = nullptr;
    bool value_owned = true;     // its value in memory of its own (not the trainer's)
    bool storage_alone = false;  // its storage object is its own (make_storage_alone)
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
  static ::torch::Tensor over(float* storage, const ::torch::Tensor& like) {
    return ::torch::from_blob(storage, like.sizes(), like.options().requires_grad(false));
  }
  // A zero_grad() that set the gradient to None (libtorch 2.x's default) dropped the binding.
  static void rebind(parameter_slot& p) {
    float* at = p.placed ? p.placed_at : p.bound;
    if (!at || (p.tensor.grad().defined() && p.tensor.grad().data_ptr() == at)) return;
    auto view = over(at, p.tensor);
    if (p.tensor.grad().defined()) view.copy_(p.tensor.grad());
    else if (!p.placed) view.zero_();
    p.tensor.mutable_grad() = view;
  }

  static std::size_t bytes_of(const parameter_slot& p) { return static_cast<std::size_t>(p.tensor.numel()) * sizeof(float); }
  // Repointing a storage object moves every tensor on it: a parameter that shares its storage
  // object with another parameter (a view of a flat buffer, a tied weight) gets one of its own
  // first, with its values.
  void make_storage_alone(parameter_slot& p) {
    if (p.storage_alone) return;
    const auto* impl = p.tensor.storage().unsafeGetStorageImpl();
    bool alone = p.tensor.storage_offset() == 0 && p.tensor.storage().nbytes() == bytes_of(p);
    for (const auto& q : params_)
      if (&q != &p && q.tensor.storage().unsafeGetStorageImpl() == impl) alone = false;
    if (!alone) p.tensor.set_data(p.tensor.detach().clone());
    p.storage_alone = true;
  }

  // The Sequential's layers and the parameters each holds, in named_parameters() order.
  void find_layers() {
    const auto children = net_->named_children();
    auto& st = *state_;
    const auto unknown = [&](std::string why) {
      layers_unknown_ = std::move(why);
      st.first.clear(), st.count.clear(), st.layer_of.clear();
    };
    std::size_t at = 0;
    for (std::size_t k = 0; k < net_->size(); ++k) {
      const auto layer_params = net_->ptr(k)->parameters(/*recurse=*/true);
      const auto n = static_cast<std::size_t>(
          std::count_if(layer_params.begin(), layer_params.end(), [](const auto& t) { return t.requires_grad(); }));
      const std::string prefix = k < children.size() ? children[k].key() + "." : std::string();
      for (std::size_t j = 0; j < n; ++j)
        if (at + j >= params_.size() || params_[at + j].name.rfind(prefix, 0) != 0)
          return unknown("layer " + std::to_string(k) + "'s parameters are not the net's parameters " +
                         std::to_string(at) + " to " + std::to_string(at + n - 1) + " in named_parameters() order");
      st.first.push_back(at);
      st.count.push_back(n);
      st.layer_of.resize(at + n, k);
      at += n;
    }
    if (at != params_.size())
      return unknown("its layers hold " + std::to_string(at) + " of the net's " + std::to_string(params_.size()) +
                     " parameters");
    st.through.assign(st.count.size(), 0);
  }

  // The net's forward. A Sequential whose values the trainer places runs layer by layer, passing
  // each layer's value on as Sequential::forward does, with the hooks around each layer's forward
  // and a hook on its output that runs before its backward. A layer whose output is not a tensor
  // cannot carry that hook: in training it keeps its parameters from its forward until its
  // backward is through.
  ::torch::Tensor run(const ::torch::Tensor& x) {
    if constexpr (detail::sequential_net<Net>) {
      auto& st = *state_;
      if (st.hooks && values_placed_) {
        std::weak_ptr<detail::hook_state> weak = state_;
        const bool training = net_->is_training() && ::torch::GradMode::is_enabled();
        ::torch::nn::AnyValue value(x);
        std::size_t k = 0;
        for (auto& layer : *net_) {
          const std::size_t first = st.first[k], count = st.count[k];
          ++k;
          if (count == 0) {
            value = layer.any_forward(std::move(value));
            continue;
          }
          st.hooks->before_forward(first, count);
          value = layer.any_forward(std::move(value));
          auto* h = value.try_get<::torch::Tensor>();
          if (training && !h) continue;  // released after its backward (accumulated())
          st.hooks->after_forward(first, count);
          if (training && h->requires_grad())
            h->register_hook([weak, first, count](const ::torch::Tensor&) {
              if (auto s = weak.lock(); s && s->hooks) s->hooks->before_backward(first, count);
            });
        }
        if (auto* y = value.try_get<::torch::Tensor>()) return *y;
        throw error("torch", "forward", -1,
                    "the Sequential's last layer returned " + std::string(value.type_info().name()) +
                        ", not a tensor; ddp::torch::module trains a net whose forward returns a torch::Tensor");
      }
    }
    return net_->forward(x);
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
  std::vector<parameter_slot> frozen_;  // requires_grad() false: not trained, not the trainer's
  std::vector<buffer_slot> buffers_;
  std::deque<buffer_version> versions_;  // stable addresses: buffer_refs point at them
  std::vector<std::shared_ptr<::torch::autograd::Node>> accumulators_;
  std::vector<tape_entry> tape_;
  bool gradient_hooks_ = false;  // the parameters' placing hooks are registered
  bool values_placed_ = false;   // the trainer places the values (update::fully_sharded)
  std::string layers_unknown_;   // why a Sequential's layers could not be told apart
};

template <class Net>
module(Net) -> module<Net>;

}  // namespace ddp::torch
