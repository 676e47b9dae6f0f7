#pragma once
// The trainer's policy list sorted into its slots (slots.hpp) and checked: each slot's own check
// in the order of the slot list (one message, the first that fails), then the rules between
// slots; the objects the trainer keeps for its policies, and their descriptions. The core is
// instantiated only for a valid list.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "ddp/concepts/module.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/policy/buffer_sync.hpp"
#include "ddp/policy/comm_hook.hpp"
#include "ddp/policy/engine.hpp"
#include "ddp/policy/reduction.hpp"
#include "ddp/policy/sync_schedule.hpp"
#include "ddp/policy/unused_params.hpp"
#include "ddp/policy/update.hpp"
#include "ddp/trainer/parts.hpp"
#include "ddp/trainer/policy_agreement.hpp"
#include "ddp/trainer/slots.hpp"
#include "ddp/trainer/trainer_core.hpp"

namespace ddp {

namespace detail {

template <class Slot, class P>
inline constexpr bool slot_accepts = slot_descriptor<Slot>::template check<P>();

// Stands in for the core of a policy list that already failed with its slot's message: it takes
// every call a program makes of a trainer, so that the slot's message is the only error.
template <class Comm, class Device>
struct invalid_core {
  using communicator_type = Comm;
  using device_type = Device;
  template <class... Args>
  explicit invalid_core(Args&&...) {}
  template <class... Args>
  void step(Args&&...) {}
  template <class... Args>
  void accumulate(Args&&...) {}
  std::size_t join() { return 0; }
};

// Sorts the policies into their slots and checks each, in the order of the slot list; the core
// is instantiated only for a valid list.
template <class Module, class List, class... Policies>
struct sorted_policies;
template <class Module, class... Slots, class... Policies>
struct sorted_policies<Module, policy::slot_list<Slots...>, Policies...> {
  using resolved = policy::resolve<policy::slot_list<Slots...>, Policies...>;
  static_assert(resolved::valid, "ddp: see the policy error above");
  template <class Slot>
  using get = typename resolved::template get<Slot>;

  using communicator = typename get<engine::communicator_slot>::type;
  using device = typename get<engine::device_slot>::type;

  // Each slot's check runs only once every slot before it passed: one message, the first.
  template <class S, class... Rest>
  static consteval bool check_in_order() {
    if constexpr (!slot_accepts<S, get<S>>) return false;
    else if constexpr (sizeof...(Rest) == 0) return true;
    else return check_in_order<Rest...>();
  }
  static constexpr bool valid = resolved::valid && check_in_order<Slots...>();

  static constexpr bool needs_reports() {
    if constexpr (requires { get<unused_params::slot>::needs_ready_reports; })
      return get<unused_params::slot>::needs_ready_reports;
    else return false;
  }
  static_assert(!valid || !needs_reports() || reports_gradient_ready<Module>,
                "ddp: this unused_params policy (forbid, the default; detect_each_step; static_graph; or one that "
                "declares needs_ready_reports) and others like it need a module that reports ready gradients, "
                "or an unused parameter would pass unseen: declare `static constexpr bool reports_gradient_ready = "
                "true;` and call ready(i) in backward for every parameter that got a gradient; or, for a module "
                "that cannot report, list ddp::unused_params::unchecked (every parameter counts as used).");
  static constexpr bool external_fits_update() {
    if constexpr (valid) return optim::applies_update<get<optim::slot>>() || !update::gathers_parameters<get<update::slot>>();
    else return true;
  }
  static_assert(external_fits_update(),
                "ddp: optim::external leaves the update to your optimizer, which needs every parameter's averaged "
                "gradient; under update::sharded a rank holds only its shard: use update::replicated");
  static constexpr bool module_places_gradients() {
    if constexpr (valid)
      return update::gradient_buckets_in_flight<get<update::slot>>() == 0 ||
             (places_gradients<Module> && binds_gradient_storage<Module>);
    else return true;
  }
  static_assert(module_places_gradients(),
                "ddp: this update policy (update::sharded_gradients, or one whose memory plan keeps gradients_kept::shard) "
                "keeps only this rank's shard of the gradients, so it places the module's gradients layer by layer "
                "in backward: the module needs `void set_layer_hooks(ddp::layer_hooks*)` (calling before_backward "
                "before each layer's backward) and `void place_gradient(std::size_t i, float* storage)` "
                "(ddp/concepts/module.hpp), and `void bind_gradient(std::size_t i, float* storage)` to take its "
                "gradients back when the trainer goes; ddp::nn::sequential and ddp::torch::module have all three. Or "
                "use update::sharded");
  static constexpr bool module_places_parameters() {
    if constexpr (valid) return !update::shards_parameters<get<update::slot>>() ||
                                (places_parameters<Module> && binds_parameter_storage<Module>);
    else return true;
  }
  static_assert(module_places_parameters(),
                "ddp: this update policy (update::fully_sharded, or one whose memory plan keeps parameters_kept::shard) keeps only "
                "this rank's shard of the parameters, so it places the module's values layer by layer in forward and "
                "backward: the module needs `void place_parameter(std::size_t i, float* storage)` and layer hooks "
                "that it calls around every layer's forward and backward (before_forward, after_forward, "
                "before_backward, after_backward: ddp/core/layer_hooks.hpp), `void bind_parameter(std::size_t i, float* "
                "storage)` to take its values back when the trainer goes, and what update::sharded_gradients needs; "
                "ddp::nn::sequential has them all, and ddp::torch::module over a torch::nn::Sequential (whose layers "
                "it runs one by one). Or use update::sharded_gradients");
  static constexpr bool hook_fits_reduction() {
    if constexpr (valid)
      return get<reduction::slot>::virtual_shards == 0 || comm_hook::is_plain<get<comm_hook::slot>>();
    else return true;
  }
  static_assert(hook_fits_reduction(),
                "ddp: reduction::invariant sums the gradients exactly, as they are; a communication hook would "
                "change them first (compression, low rank) and its result depends on the world size: use "
                "comm_hook::none with reduction::invariant (or a hook that declares `plain = true`)");
  static constexpr bool buffer_sync_fits_reduction() {
    if constexpr (valid)
      return get<reduction::slot>::virtual_shards == 0 || !buffer_sync::refused_under_invariant<get<buffer_sync::slot>>;
    else return true;
  }
  static_assert(buffer_sync_fits_reduction(),
                "ddp: under reduction::invariant ranks run as many forwards as they hold shards, which differ "
                "when the world size does not divide V: a collective per forward (buffer_sync::"
                "broadcast_each_forward) would pair with another rank's reduction; and every rank's buffers are "
                "already the same after each step, where an average of N equal floats can change their last bit "
                "(buffer_sync::average_once_per_step), and a buffer_sync::one_of must not offer either. Use "
                "broadcast_once_per_step (the default) or none");
  static constexpr bool schedule_fits_reduction() {
    if constexpr (valid)
      return get<reduction::slot>::virtual_shards == 0 || sync_schedule::syncs_every_step<get<sync_schedule::slot>>();
    else return true;
  }
  static_assert(schedule_fits_reduction(),
                "ddp: reduction::invariant makes a step the same bits at every world size, but a sync schedule that "
                "skips the gradients' reduction (sync_schedule::local_sgd, diloco, or one without `every_step_sync`) "
                "lets each rank step on its own data, which depends on the world size: use sync_schedule::every_step "
                "with reduction::invariant, or reduction::plain with this schedule");
  static constexpr bool schedule_fits_update() {
    if constexpr (valid)
      return !update::gathers_parameters<get<update::slot>>() || sync_schedule::syncs_every_step<get<sync_schedule::slot>>();
    else return true;
  }
  static_assert(schedule_fits_update(),
                "ddp: a sync schedule that skips the gradients' reduction (sync_schedule::local_sgd, diloco) lets "
                "each rank update every parameter on its own between syncs, but this update policy (update::sharded, "
                "sharded_gradients, fully_sharded, or one that gathers parameters) keeps only this rank's shard of "
                "the optimizer state: use update::replicated with this schedule, or sync_schedule::every_step");
  static constexpr bool schedule_fits_optimizer() {
    if constexpr (valid)
      return optim::applies_update<get<optim::slot>>() || sync_schedule::syncs_every_step<get<sync_schedule::slot>>();
    else return true;
  }
  static_assert(schedule_fits_optimizer(),
                "ddp: optim::external leaves the update to your optimizer after step() returns, but a sync schedule "
                "other than every_step syncs the parameters inside step(), after the update (sync_schedule::"
                "local_sgd, diloco): use an optimizer the trainer applies (optim::sgd, optim::adamw) with this "
                "schedule, or sync_schedule::every_step with optim::external");
  using core = std::conditional_t<valid, trainer_core<Module, communicator, device>, invalid_core<communicator, device>>;

  template <class Slot>
  using holder_type = typename slot_descriptor<Slot>::template holder<get<Slot>, device>;

  // The policy objects, one holder per slot (slots.hpp); a base of ddp::trainer, so that they
  // exist before its core.
  struct holders : slot_holder<Slots, holder_type<Slots>>... {
    explicit holders(get<optim::slot>&& opt) : slot_holder<Slots, holder_type<Slots>>(std::move(opt))... {}

    template <class Slot>
    static constexpr bool has = slot_index<Slot, Slots...>() < sizeof...(Slots);
    template <class Slot>
    auto& of() noexcept { return static_cast<slot_holder<Slot, holder_type<Slot>>&>(*this).held; }
    template <class Slot>
    const auto& of() const noexcept { return static_cast<const slot_holder<Slot, holder_type<Slot>>&>(*this).held; }
    trainer_parts_ref<device> parts() { return trainer_parts_ref<device>(*this); }
    // "slot=name, ..." of every described slot as the trainer holds them (`checkpoint`: only
    // those a checkpoint must match).
    std::string describe(bool checkpoint) const {
      return describe_policies({describe_slot<Slots>(checkpoint)...});
    }
    template <class Slot>
    std::pair<std::string_view, std::string> describe_slot(bool checkpoint) const {
      using d = slot_descriptor<Slot>;
      if constexpr (d::described)
        if (d::in_checkpoint || !checkpoint) return {Slot::name, d::template describe<get<Slot>>(of<Slot>())};
      return {Slot::name, std::string()};
    }
    // What the ranks agree on (trainer/policy_agreement.hpp): every slot's policy as held now,
    // and how many times the slots' run-time choices (a one_of's select) chose.
    slot_descriptions descriptions() const { return {describe_slot<Slots>(false)...}; }
    std::uint64_t selections() const { return (selections_in<Slots>() + ... + std::uint64_t{0}); }
    template <class Slot>
    std::uint64_t selections_in() const {
      if constexpr (requires { of<Slot>().policy.selections(); }) return of<Slot>().policy.selections();
      else return 0;
    }
    static constexpr bool chooses_at_run_time = (holds_run_time_choice<holder_type<Slots>> || ...);
    // The same of the policy types, without building them.
    static std::string describe_types() {
      return describe_policies({std::pair<std::string_view, std::string>{Slots::name, [] {
        if constexpr (slot_descriptor<Slots>::described)
          return slot_descriptor<Slots>::template describe_type<get<Slots>>();
        else return std::string();
      }()}...});
    }
  };
  // An invalid list has already failed with its slot's message: nothing is built from it.
  struct no_holders {
    explicit no_holders(get<optim::slot>&&) {}
    std::nullptr_t parts() { return nullptr; }
  };
  using holder_base = std::conditional_t<valid, holders, no_holders>;
};

template <class Module, class... Policies>
using trainer_policies =
    sorted_policies<Module, typename with_policy_slots<trainer_slots, Policies...>::type, Policies...>;

}  // namespace detail

}  // namespace ddp
