#pragma once
// What a step function works with: forward and backward of the module, with the trainer's
// buffer synchronisation and readiness tracking around them (trainer_core runs them).
namespace ddp::detail {

template <class Core>
class replica {
 public:
  using module_type = typename Core::module_type;
  using input_type = typename Core::input_type;
  using output_type = typename Core::output_type;

  output_type forward(const input_type& x) { return core_.forward(x); }
  // Returns what the module's backward returns: nothing, or the gradient with respect to its
  // input for a module asked for it (ddp::nn::sequential::compute_input_gradient).
  decltype(auto) backward(const output_type& grad_output) { return core_.backward(grad_output); }
  module_type& module() noexcept { return module_; }
  int rank() const noexcept { return rank_; }

 private:
  friend Core;
  replica(Core& core, module_type& module, int rank) : core_(core), module_(module), rank_(rank) {}
  Core& core_;
  module_type& module_;
  int rank_;
};

}  // namespace ddp::detail
