#pragma once
// Sync schedule: when the ranks' replicas are brought together.
//
//   every_step        (default) every step averages every gradient over the ranks before the
//                     update, so the replicas never differ.
//   local_sgd<H, W>   the first W steps as every_step (a warm-up), then each rank takes H steps
//                     on its own gradients (no collective), and after the H-th the ranks
//                     average their parameters. Between averages the replicas differ.
//   diloco<H, Outer>  DiLoCo (arXiv 2311.08105): each rank takes H inner steps on its own
//                     gradients with the trainer's optimizer; then the ranks average the
//                     pseudo-gradient, the anchor (the parameters after the last outer step)
//                     minus the local parameters, and the outer optimizer steps the anchor with
//                     it; every rank's parameters become the new anchor. Outer: an optimizer
//                     (ddp/optim), by default Nesterov SGD at lr 0.7 and momentum 0.9. Keeps the
//                     anchor and the outer optimizer's state: one more copy of the parameters,
//                     plus the outer optimizer's state.
//
// A run that ends between syncs takes the period's sync at once with trainer.sync_now(), so that
// every rank leaves with the same parameters (docs/sync-schedules.md).
//
// What goes over the network at a sync (the parameters, or the pseudo-gradient) goes through the
// comm_hook slot in the trainer's buckets, as gradients do: bf16, fp16, PowerSGD and
// comm_hook::int8_rows compress it.
//
// A policy of this slot is a type with
//   using slot = ddp::sync_schedule::slot;  static constexpr std::string_view name;
//   bool reduces_gradients(std::uint64_t step) const;  // whether step `step` (counting from 0)
//        // averages its gradients over the ranks; false: each rank updates with its own
//   ddp::sync_schedule::action after_update(std::uint64_t step) const;  // what follows its update
// and, when after_update may return action::outer_step, an optimizer `outer` (ddp/optim) that
// steps the anchor with the averaged pseudo-gradient. Optionally
//   static constexpr bool every_step_sync = true;  // reduces every step and never syncs otherwise:
//        // taken with reduction::invariant, join() and every update policy.
// The answers must be the same on every rank (they decide which collectives go).
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/optim/optimizer.hpp"
#include "ddp/optim/sgd.hpp"
#include "ddp/policy/slots.hpp"

namespace ddp::policy::sync_schedule {

struct slot;

enum class action {
  none,                // nothing: the next step goes on from this rank's parameters
  average_parameters,  // the ranks' parameters averaged (local SGD)
  outer_step,          // the pseudo-gradient averaged and the outer optimizer's step (DiLoCo)
};

struct every_step {
  using slot = sync_schedule::slot;
  static constexpr std::string_view name = "every_step";
  static constexpr bool every_step_sync = true;
  static constexpr bool unnamed = true;  // a trainer and its checkpoints read as without the slot
  bool reduces_gradients(std::uint64_t) const noexcept { return true; }
  action after_update(std::uint64_t) const noexcept { return action::none; }
};

template <std::size_t H, std::size_t Warmup = 0>
struct local_sgd {
  static_assert(H >= 1, "ddp: sync_schedule::local_sgd<H> averages the parameters every H >= 1 steps");
  using slot = sync_schedule::slot;
  static constexpr std::string_view name = "local_sgd";
  static constexpr std::size_t period = H;
  static constexpr std::size_t warmup = Warmup;
  bool reduces_gradients(std::uint64_t step) const noexcept { return step < Warmup; }
  action after_update(std::uint64_t step) const noexcept {
    if (step < Warmup) return action::none;
    return (step - Warmup + 1) % H == 0 ? action::average_parameters : action::none;
  }
  std::string describe() const { return "local_sgd(" + std::to_string(H) + ", warmup " + std::to_string(Warmup) + ")"; }
};

// DiLoCo's outer optimizer: SGD with Nesterov momentum, lr 0.7, momentum 0.9.
inline constexpr optim::sgd nesterov_outer{.lr = 0.7f, .momentum = 0.9f, .weight_decay = 0.0f, .nesterov = true};

template <std::size_t H, optim::optimizer Outer = optim::sgd>
struct diloco {
  static_assert(H >= 1, "ddp: sync_schedule::diloco<H> takes an outer step every H >= 1 inner steps");
  static_assert(optim::applies_update<Outer>(),
                "ddp: sync_schedule::diloco's outer optimizer must apply its update (optim::external cannot step the "
                "anchor)");
  using slot = sync_schedule::slot;
  static constexpr std::string_view name = "diloco";
  static constexpr std::size_t period = H;
  Outer outer = default_outer();
  bool reduces_gradients(std::uint64_t) const noexcept { return false; }
  action after_update(std::uint64_t step) const noexcept {
    return (step + 1) % H == 0 ? action::outer_step : action::none;
  }
  std::string describe() const {
    std::string o;
    if constexpr (requires { outer.describe(); }) o = outer.describe();
    else o = std::string(Outer::name);
    return "diloco(" + std::to_string(H) + ", outer " + o + ")";
  }

 private:
  static constexpr Outer default_outer() {
    if constexpr (std::is_same_v<Outer, optim::sgd>) return nesterov_outer;
    else return Outer{};
  }
};

// Streaming DiLoCo (arXiv 2501.18512): DiLoCo over F fragments of the model (the trainer's
// buckets: bucket b is in fragment b % F), each synced every H steps on a staggered schedule
// (fragment f after the updates of steps t with (t + 1) % H == f H / F). A fragment's
// pseudo-gradient is reduced after its sync step and applied Delay steps later, while the inner
// steps go on; then its parameters become mixing * local + (1 - mixing) * the new anchor.
// Delay 0: applied at once; Delay >= 1: reduced in memory of its own, overlapped with the inner
// steps. Either way through the comm hook. Needs at least F buckets (bucket_cap).
template <std::size_t H, std::size_t Fragments, std::size_t Delay = 0, optim::optimizer Outer = optim::sgd>
struct streaming_diloco {
  static_assert(H >= 1 && Fragments >= 1 && Fragments <= H,
                "ddp: sync_schedule::streaming_diloco<H, F> syncs F fragments staggered over H steps: 1 <= F <= H");
  static_assert(Delay < H, "ddp: sync_schedule::streaming_diloco<H, F, Delay>: a fragment's reduction must be applied "
                           "(Delay steps later) before the fragment syncs again: Delay < H");
  using slot = sync_schedule::slot;
  static constexpr std::string_view name = "streaming_diloco";
  static constexpr std::size_t period = H, fragments = Fragments, delay = Delay;
  Outer outer = diloco<H, Outer>{}.outer;
  float mixing = Delay == 0 ? 0.0f : 0.5f;  // the local parameters' share when a fragment is applied
  bool reduces_gradients(std::uint64_t) const noexcept { return false; }
  action after_update(std::uint64_t) const noexcept { return action::none; }
  // The fragment whose sync starts after the update of step `step`, if any.
  std::optional<std::size_t> fragment_due(std::uint64_t step) const noexcept {
    const std::uint64_t phase = (step + 1) % H;
    for (std::size_t f = 0; f < Fragments; ++f)
      if (phase == f * H / Fragments) return f;
    return std::nullopt;
  }
  std::string describe() const {
    std::string o;
    if constexpr (requires { outer.describe(); }) o = outer.describe();
    else o = std::string(Outer::name);
    return "streaming_diloco(" + std::to_string(H) + ", " + std::to_string(Fragments) + " fragments, delay " +
           std::to_string(Delay) + ", mixing " + std::to_string(mixing) + ", outer " + o + ")";
  }
};

template <class P>
concept policy = requires(const P& p, std::uint64_t step) {
  requires std::same_as<typename P::slot, slot>;
  { P::name } -> std::convertible_to<std::string_view>;
  { p.reduces_gradients(step) } -> std::convertible_to<bool>;
  { p.after_update(step) } -> std::same_as<action>;
};

// The policy averages every step's gradients and never syncs otherwise (declared).
template <class P>
consteval bool syncs_every_step() {
  if constexpr (requires { { P::every_step_sync } -> std::convertible_to<bool>; }) return P::every_step_sync;
  else return false;
}
// The policy syncs the model fragment by fragment (streaming_diloco's members).
// (fragments, delay and mixing: members, static or not; fragments 0 syncs the whole model.)
template <class P>
concept streams_fragments = requires(const P& p, std::uint64_t step) {
  { p.fragment_due(step) } -> std::same_as<std::optional<std::size_t>>;
  { p.fragments } -> std::convertible_to<std::size_t>;
  { p.delay } -> std::convertible_to<std::size_t>;
  { p.mixing } -> std::convertible_to<float>;
};
// The policy takes outer steps: it keeps an anchor and an outer optimizer.
template <class P>
concept has_outer = requires(P& p) { requires optim::optimizer<std::remove_cvref_t<decltype(p.outer)>>; };

struct slot {
  static constexpr std::string_view name = "sync_schedule";
  using default_policy = every_step;
};

template <class P>
consteval bool diagnose() {
  static_assert(requires { { P::name } -> std::convertible_to<std::string_view>; },
                "ddp: a policy in the sync_schedule slot lacks `static constexpr std::string_view name`");
  static_assert(requires(const P& p, std::uint64_t s) { { p.reduces_gradients(s) } -> std::convertible_to<bool>; },
                "ddp: a policy in the sync_schedule slot lacks `bool reduces_gradients(std::uint64_t step) const` "
                "(see ddp/policy/sync_schedule.hpp)");
  static_assert(requires(const P& p, std::uint64_t s) { { p.after_update(s) } -> std::same_as<action>; },
                "ddp: a policy in the sync_schedule slot lacks `ddp::sync_schedule::action after_update(std::uint64_t "
                "step) const` (see ddp/policy/sync_schedule.hpp)");
  return policy<P>;
}

}  // namespace ddp::policy::sync_schedule

// The slot's short spelling, as policy lists write it.
namespace ddp {
namespace sync_schedule = policy::sync_schedule;
}
