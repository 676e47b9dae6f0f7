#pragma once
// A module that binds storage keeps its gradients (and, when the update policy gathers
// parameters, its values) in bucket memory: a storage_return points the module there once the
// reducer has placed every parameter, and hands the storage back to the module before the
// buckets go, also when construction fails half-way. Under an update policy that keeps only its
// shard of the gradients, it places the module's gradients nowhere instead, and gives the module
// the reducer's layer hooks (residency_hooks.hpp), through which the residencies place them layer
// by layer in backward (module_placement.hpp: given to them when they were built); under one that
// keeps only its shard of the parameters, the module's values too, layer by layer in forward and
// backward (the module holds no parameter between steps, unless gathered).
#include <cstddef>
#include <functional>
#include <vector>

#include "ddp/concepts/module.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/trainer/parameter_table.hpp"

namespace ddp::detail {

// Whether the module's values live in the gathered copy: it binds parameter storage, the update
// policy gathers, and no parameter has 16 bits (their f32 masters live in the trainer, and every
// value is copied in and out).
template <class Module>
bool binds_values(const parameter_table& params, bool update_gathers) {
  return binds_parameter_storage<Module> && update_gathers && params.half_floats() == 0;
}

template <class Module>
class storage_return {
 public:
  // Binds each parameter's gradient (f32 ones) and, with `values`, its value to where `params`
  // says they now live.
  template <class Reducer>
  storage_return(Module& module, const parameter_table& params, bool values, Reducer& reducer)
      : module_(&module) {
    try {
      if constexpr (places_gradients<Module>)
        if (reducer.gradients().active()) {
          placing_ = true;
          for (std::size_t i = 0; i < params.size(); ++i)
            if (params[i].type == dtype::f32) {
              module.place_gradient(i, nullptr);
              gradients_.push_back(i);
            }
          if constexpr (places_parameters<Module>)
            if (auto& parameters = reducer.parameters(); parameters.active())
              warn_unless_gathered_ = [&parameters] { parameters.warn_unless_gathered(); };
          module.set_layer_hooks(&reducer.hooks());
        }
      for (std::size_t i = 0; i < params.size(); ++i) {
        if constexpr (binds_gradient_storage<Module>)
          if (params[i].type == dtype::f32 && !placing_) {
            module.bind_gradient(i, params[i].grad);
            gradients_.push_back(i);
          }
        if constexpr (binds_parameter_storage<Module>)
          if (values) {
            module.bind_parameter(i, params[i].value);
            values_.push_back(i);
          }
      }
    } catch (...) {
      give_back();
      throw;
    }
  }
  storage_return(const storage_return&) = delete;
  storage_return& operator=(const storage_return&) = delete;
  ~storage_return() { give_back(); }

 private:
  void give_back() noexcept {
    try {
      if constexpr (places_gradients<Module>)
        if (placing_) {  // the trainer goes: no step places anything from now on
          module_->set_layer_hooks(nullptr);
          if (warn_unless_gathered_) warn_unless_gathered_();
        }
      if constexpr (binds_gradient_storage<Module>)
        for (const auto i : gradients_) module_->bind_gradient(i, nullptr);
      if constexpr (binds_parameter_storage<Module>)
        for (const auto i : values_) module_->bind_parameter(i, nullptr);
    } catch (...) {  // a module that cannot take storage back keeps dangling views; nothing else to do here
    }
  }

  Module* module_;
  // The residencies place the module's gradients layer by layer (the module's layer hooks are
  // theirs) until it takes its storage back; under sharded parameters, what that says of them.
  bool placing_ = false;
  std::function<void()> warn_unless_gathered_;
  std::vector<std::size_t> gradients_;  // parameters with bound gradients
  std::vector<std::size_t> values_;     // parameters with bound values
};

}  // namespace ddp::detail
