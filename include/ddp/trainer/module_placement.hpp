#pragma once
// How the residencies point the module's tensors at memory under a memory plan that keeps only
// this rank's shard (gradient_residency.hpp, parameter_residency.hpp): the module's
// place_gradient and place_parameter, given to them when they are built by the trainer core,
// which knows the module. Empty where the plan keeps the tensors whole (nothing is placed); the
// module's storage is pointed nowhere first, and given back, by storage_return.hpp.
#include <cstddef>
#include <functional>

#include "ddp/concepts/module.hpp"
#include "ddp/policy/update.hpp"

namespace ddp::detail {

struct module_placement {
  std::function<void(std::size_t i, float* at)> gradient;   // at nullptr: nowhere
  std::function<void(std::size_t i, float* at)> parameter;  // the same for its value
};

template <class Module>
module_placement placement_of(Module& module, const update::memory_plan& plan) {
  module_placement p;
  if constexpr (places_gradients<Module>)
    if (plan.shards_gradients()) {
      p.gradient = [m = &module](std::size_t i, float* at) { m->place_gradient(i, at); };
      if constexpr (places_parameters<Module>)
        if (plan.shards_parameters()) p.parameter = [m = &module](std::size_t i, float* at) { m->place_parameter(i, at); };
    }
  return p;
}

}  // namespace ddp::detail
