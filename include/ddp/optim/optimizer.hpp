#pragma once
// The optimizer slot: ddp::optim::sgd (default), ddp::optim::adamw, or a user's optimizer,
// listed among the trainer's policies; its hyper-parameters are the value passed to the trainer
// (trainer.optimizer() changes them between steps, e.g. for a schedule).
//
// An optimizer is an element rule, written once for every device:
//   using slot = ddp::optim::slot;  static constexpr std::string_view name;
//   static constexpr int state_slots;      // floats of state per parameter element (0 to 3)
//   float lr;                              // the learning rate schedules set
//   Rule at(std::int64_t t) const;         // the rule for a parameter's t-th update (1-based)
//   std::string describe() const;
// where Rule is a copyable struct with
//   DDP_HOST_DEVICE void operator()(float& p, float g, float* state) const;
// updating one element p from its averaged gradient g and its state[0 .. state_slots). The
// device runs it over a bucket in one fused pass (host: a vectorised loop; CUDA: one kernel per
// rule, instantiated by DDP_CUDA_OPTIMIZER(Type) in a .cu file, see docs/cuda.md).
//
//   struct lion {                         // written outside the library
//     using slot = ddp::optim::slot;
//     static constexpr std::string_view name = "lion";
//     static constexpr int state_slots = 1;
//     float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.99f, weight_decay = 0.0f;
//     struct rule {
//       float lr, beta1, beta2, weight_decay;
//       DDP_HOST_DEVICE void operator()(float& p, float g, float* s) const {
//         const float c = beta1 * s[0] + (1.0f - beta1) * g;
//         p = p * (1.0f - lr * weight_decay) - lr * ((c > 0.0f) - (c < 0.0f));
//         s[0] = beta2 * s[0] + (1.0f - beta2) * g;
//       }
//     };
//     rule at(std::int64_t) const { return {lr, beta1, beta2, weight_decay}; }
//     std::string describe() const { return "lion"; }
//   };
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "ddp/core/host_device.hpp"
#include "ddp/optim/adamw.hpp"
#include "ddp/optim/sgd.hpp"

namespace ddp::optim {

struct slot {
  static constexpr std::string_view name = "optimizer";
  using default_policy = sgd;
};

// An optimizer that leaves the update to the caller (optim::external) declares
//   static constexpr bool applies_update = false;
// the trainer then neither updates the parameters nor zeroes the averaged gradients.
template <class O>
constexpr bool applies_update() {
  if constexpr (requires { { O::applies_update } -> std::convertible_to<bool>; }) return O::applies_update;
  else return true;
}

// The largest state a device kernel keeps per element.
inline constexpr int max_state_slots = 3;

template <class O>
using rule_of = decltype(std::declval<const O&>().at(std::int64_t{1}));

template <class R>
concept element_rule = std::copyable<R> && requires(const R& r, float& p, float g, float* s) { r(p, g, s); };

template <class O>
concept optimizer = requires(O& o, const O& co) {
  requires std::same_as<typename O::slot, slot>;
  { O::name } -> std::convertible_to<std::string_view>;
  { O::state_slots } -> std::convertible_to<int>;
  requires O::state_slots >= 0 && O::state_slots <= max_state_slots;
  { o.lr } -> std::convertible_to<float>;
  o.lr = 1.0f;
  { co.describe() } -> std::convertible_to<std::string>;
  requires element_rule<rule_of<O>>;
};

template <class O>
consteval bool diagnose() {
  static_assert(requires { { O::name } -> std::convertible_to<std::string_view>; },
                "ddp: the optimizer lacks `static constexpr std::string_view name`");
  static_assert(requires { { O::state_slots } -> std::convertible_to<int>; },
                "ddp: the optimizer lacks `static constexpr int state_slots` (floats of state per element)");
  static_assert(requires(O& o) { o.lr = 1.0f; }, "ddp: the optimizer lacks a `float lr` member (schedules set it)");
  static_assert(requires(const O& o) { { o.describe() } -> std::convertible_to<std::string>; },
                "ddp: the optimizer lacks `std::string describe() const`");
  static_assert(requires(const O& o) { o.at(std::int64_t{1}); },
                "ddp: the optimizer lacks `Rule at(std::int64_t step) const` returning its element rule "
                "(see ddp/optim/optimizer.hpp)");
  if constexpr (requires(const O& o) { o.at(std::int64_t{1}); })
    static_assert(element_rule<rule_of<O>>,
                  "ddp: the optimizer's rule lacks `void operator()(float& p, float g, float* state) const` "
                  "(mark it DDP_HOST_DEVICE to run on CUDA too)");
  if constexpr (requires { { O::state_slots } -> std::convertible_to<int>; })
    static_assert(O::state_slots >= 0 && O::state_slots <= max_state_slots,
                  "ddp: the optimizer's state_slots must be 0 to 3");
  return optimizer<O>;
}

}  // namespace ddp::optim
