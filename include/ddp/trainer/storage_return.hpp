#pragma once
// The trainer points a module's gradients (and, when the update policy gathers parameters, its
// values) into bucket memory; a storage_return hands that storage back to the module before the
// buckets go, also when construction fails half-way.
#include <cstddef>
#include <vector>

#include "ddp/concepts/module.hpp"

namespace ddp::detail {

template <class Module>
struct storage_return {
  Module* module = nullptr;
  std::vector<std::size_t> gradients;  // parameters with bound gradients
  std::vector<std::size_t> values;     // parameters with bound values

  storage_return() = default;
  storage_return(const storage_return&) = delete;
  storage_return& operator=(const storage_return&) = delete;
  ~storage_return() {
    try {
      if constexpr (binds_gradient_storage<Module>)
        for (const auto i : gradients) module->bind_gradient(i, nullptr);
      if constexpr (binds_parameter_storage<Module>)
        for (const auto i : values) module->bind_parameter(i, nullptr);
    } catch (...) {  // a module that cannot take storage back keeps dangling views; nothing else to do here
    }
  }
};

}  // namespace ddp::detail
