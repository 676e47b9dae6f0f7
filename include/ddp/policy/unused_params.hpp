#pragma once
// UnusedParamDetection: what happens to a parameter that gets no gradient in a step.
//
//   forbid             (default) every rank raises one error listing each parameter that got no
//                      gradient on some rank, and naming the two policies below. Costs nothing
//                      while every parameter is used (the check rides in the last bucket).
//   detect_each_step   each step the ranks agree on which parameters were used anywhere; one
//                      used on some ranks is averaged over all (the others count zero), one used
//                      nowhere is left untouched by the optimizer. Costs one small extra reduction
//                      (a flag per parameter, carried in the last bucket).
//   static_graph       the first step learns the used set as detect_each_step does; later steps
//                      cost nothing extra, and a parameter whose use changes is an error naming it.
// The detecting policies need a module that reports ready gradients
// (`static constexpr bool reports_gradient_ready = true`).
#include <string_view>

#include "ddp/policy/slots.hpp"

namespace ddp::unused_params {

struct slot;

struct forbid {
  using slot = unused_params::slot;
  static constexpr std::string_view name = "forbid";
};
struct detect_each_step {
  using slot = unused_params::slot;
  static constexpr std::string_view name = "detect_each_step";
};
struct static_graph {
  using slot = unused_params::slot;
  static constexpr std::string_view name = "static_graph";
};

struct slot {
  static constexpr std::string_view name = "unused_params";
  using default_policy = forbid;
};

}  // namespace ddp::unused_params
