#pragma once
// The trainer's slots, each declared once. A slot's name, default and concept live with its
// policies (ddp/policy/*.hpp, ddp/optim, ddp/sampler); its descriptor here says what the trainer
// does with a policy in it:
//
//   check<P>()         the slot's diagnosis: one static_assert message per missing member
//   holder<P, Device>  the object the trainer keeps for the policy (its `policy` member is what
//                      trainer.policy<Slot>() returns): a part adapter (trainer/parts.hpp) that
//                      the core's components call, or the policy alone
//   part<Device>       the interface the core sees (void: the core never calls the slot)
//   description        the policy's name in describe(), and whether checkpoints compare it
//
// The trainer's slot sorting, checks, policy objects, descriptions and the parts handed to its
// core iterate `trainer_slots`, and the slots of listed policies that have a descriptor
// (with_policy_slots). A new slot of the library: its descriptor here and its place in the list,
// a part and adapter in parts.hpp when the core calls it, and the component that uses it. A slot
// a program declares: its descriptor, specialised where the program declares the slot.
#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ddp/optim/optimizer.hpp"
#include "ddp/policy/bucket_cap.hpp"
#include "ddp/policy/buffer_sync.hpp"
#include "ddp/policy/comm_hook.hpp"
#include "ddp/policy/engine.hpp"
#include "ddp/policy/reduction.hpp"
#include "ddp/policy/slots.hpp"
#include "ddp/policy/sync_schedule.hpp"
#include "ddp/policy/unused_params.hpp"
#include "ddp/policy/update.hpp"
#include "ddp/sampler/sampler.hpp"
#include "ddp/trainer/parts.hpp"

namespace ddp::detail {

// A policy the core never calls (a sampler: the trainer deals the epochs itself).
template <class P>
struct policy_holder {
  policy_holder() : policy() {}
  P policy;
};
// An engine slot names a type (`choice::type`); the trainer keeps no object for it.
template <class P>
struct engine_holder {
  using choice = P;
};

template <class Slot>
struct slot_descriptor;

// The common case: described by the policy type's name, compared by checkpoints.
// describe_type<P>() describes the type; describe<P>(holder) what the trainer holds (the same,
// unless a policy chooses at run time: a one_of, ddp/policy/one_of.hpp).
struct named_description {
  static constexpr bool described = true;
  static constexpr bool in_checkpoint = true;
  template <class P>
  static std::string describe_type() { return std::string(P::name); }
  template <class P, class H>
  static std::string describe(const H& h) {
    if constexpr (requires { h.policy.selected(); }) return std::string(h.policy.selected());
    else return describe_type<P>();
  }
};

// A slot added after checkpoints were written: a policy that declares `static constexpr bool
// unnamed = true` (it does what a trainer without the slot did: the slot's default) goes unnamed,
// so that a checkpoint written before the slot existed (whose policies line has no such slot)
// still loads, and one written with another policy in it names the difference.
template <class P>
consteval bool declared_unnamed() {
  if constexpr (requires { { P::unnamed } -> std::convertible_to<bool>; }) return P::unnamed;
  else return false;
}
struct unnamed_default_description : named_description {
  template <class P>
  static std::string describe_type() {
    if constexpr (declared_unnamed<P>()) return std::string();
    else return named_description::describe_type<P>();
  }
  template <class P, class H>
  static std::string describe(const H& h) {
    if constexpr (declared_unnamed<P>()) return std::string();
    else return named_description::describe<P>(h);
  }
};

// Whether the trainer knows how to hold a policy of `Slot` (its descriptor is declared).
template <class Slot>
concept described_slot = requires { sizeof(slot_descriptor<Slot>); };

template <>
struct slot_descriptor<buffer_sync::slot> : named_description {
  template <class P>
  static consteval bool check() { return buffer_sync::diagnose<P>(); }
  template <class P, class Device>
  using holder = buffer_sync_adapter<P>;
  template <class Device>
  using part = buffer_sync_part;
};

template <>
struct slot_descriptor<unused_params::slot> : named_description {
  template <class P>
  static consteval bool check() { return unused_params::diagnose<P>(); }
  template <class P, class Device>
  using holder = unused_params_adapter<P>;
  template <class Device>
  using part = unused_params_part;
};

template <>
struct slot_descriptor<buckets::slot> : named_description {
  template <class P>
  static consteval bool check() { return buckets::diagnose<P>(); }
  template <class P, class Device>
  using holder = bucket_adapter<P>;
  template <class Device>
  using part = const bucket_part;
  // The plan's text, from the type (as the plan was built), whatever the held object is now.
  template <class P>
  static std::string describe_type() { return P{}.describe(); }
  template <class P, class H>
  static std::string describe(const H&) { return describe_type<P>(); }
};

template <>
struct slot_descriptor<optim::slot> : named_description {
  template <class P>
  static consteval bool check() { return optim::diagnose<P>(); }
  template <class P, class Device>
  using holder = optimizer_adapter<P, Device>;
  template <class Device>
  using part = optimizer_part<Device>;
};

template <>
struct slot_descriptor<update::slot> : named_description {
  template <class P>
  static consteval bool check() { return update::diagnose<P>(); }
  template <class P, class Device>
  using holder = update_adapter<P>;
  template <class Device>
  using part = update_part;
};

// The plain reduction goes unnamed, so that a trainer reads, and its checkpoints match, as one
// without a hook; a hook chosen at run time (comm_hook::one_of) describes its choice.
template <>
struct slot_descriptor<comm_hook::slot> : named_description {
  template <class P>
  static consteval bool check() { return comm_hook::diagnose<P>(); }
  template <class P, class Device>
  using holder = comm_hook_adapter<P, Device>;
  template <class Device>
  using part = comm_hook_part<Device>;
  template <class P>
  static std::string describe_type() {
    if constexpr (comm_hook::is_plain<P>()) return std::string();
    else return std::string(P::name);
  }
  template <class P, class H>
  static std::string describe(const H& h) {
    if (h.plain()) return std::string();
    if constexpr (requires { h.policy.describe(); }) return h.policy.describe();
    else return describe_type<P>();
  }
};

// The plain reduction goes unnamed (a trainer reads, and its checkpoints match, as one without the
// slot); invariant<V> names V, which a resumed run must keep.
template <>
struct slot_descriptor<reduction::slot> : named_description {
  template <class P>
  static consteval bool check() { return reduction::diagnose<P>(); }
  template <class P, class Device>
  using holder = reduction_adapter<P>;
  template <class Device>
  using part = reduction_part;
  template <class P>
  static std::string describe_type() {
    if constexpr (P::virtual_shards == 0) return "";
    else if constexpr (requires { P{}.describe(); }) return P{}.describe();
    else return std::string(P::name);
  }
  template <class P, class H>
  static std::string describe(const H&) { return describe_type<P>(); }
};

// Added after checkpoints were written: every_step declares itself unnamed, so older checkpoints
// load; a checkpoint of another schedule is refused by name.
template <>
struct slot_descriptor<sync_schedule::slot> : unnamed_default_description {
  template <class P>
  static consteval bool check() { return sync_schedule::diagnose<P>(); }
  template <class P, class Device>
  using holder = sync_schedule_adapter<P, Device>;
  template <class Device>
  using part = sync_schedule_part<Device>;
  // A schedule's period (and fragments, delay, outer optimizer) are part of what it is.
  template <class P>
  static std::string describe_type() {
    if constexpr (declared_unnamed<P>()) return std::string();
    else if constexpr (requires { P{}.describe(); }) return P{}.describe();
    else return std::string(P::name);
  }
  template <class P, class H>
  static std::string describe(const H& h) {
    if constexpr (declared_unnamed<P>()) return std::string();
    else if constexpr (requires { h.policy.describe(); }) return h.policy.describe();
    else return std::string(P::name);
  }
};

// A run saved in-process may go on under mpirun: checkpoints do not compare the communicator.
template <>
struct slot_descriptor<engine::communicator_slot> {
  template <class P>
  static consteval bool check() { return engine::diagnose_communicator_slot<typename P::type>(); }
  template <class P, class Device>
  using holder = engine_holder<P>;
  template <class Device>
  using part = void;
  static constexpr bool described = true;
  static constexpr bool in_checkpoint = false;
  template <class P>
  static std::string describe_type() { return std::string(P::type::backend_name); }
  template <class P, class H>
  static std::string describe(const H&) { return describe_type<P>(); }
};

template <>
struct slot_descriptor<sampler::slot> : named_description {
  template <class P>
  static consteval bool check() { return sampler::diagnose<P>(); }
  template <class P, class Device>
  using holder = policy_holder<P>;
  template <class Device>
  using part = void;
};

template <>
struct slot_descriptor<engine::device_slot> {
  template <class P>
  static consteval bool check() { return engine::diagnose_device_slot<typename P::type>(); }
  template <class P, class Device>
  using holder = engine_holder<P>;
  template <class Device>
  using part = void;
  static constexpr bool described = false;
  static constexpr bool in_checkpoint = false;
};

// In the order describe() lists them (checkpoints compare that text).
using trainer_slots =
    policy::slot_list<buffer_sync::slot, unused_params::slot, buckets::slot, optim::slot, update::slot,
                      comm_hook::slot, reduction::slot, engine::communicator_slot, sampler::slot,
                      engine::device_slot, sync_schedule::slot>;

// The trainer's slots for a policy list: trainer_slots, then the slot of each listed policy that
// is not among them but has a descriptor (a slot declared outside the library: its descriptor and
// its policies are all it takes). A policy of a slot without one is refused as before.
template <class List, class... Policies>
struct with_policy_slots {
  using type = List;
};
template <class... Slots, class P, class... Policies>
struct with_policy_slots<policy::slot_list<Slots...>, P, Policies...> {
  using slot = typename policy::detail::slot_of<P>::type;
  static constexpr bool added = [] {
    if constexpr (std::is_void_v<slot> || (std::is_same_v<slot, Slots> || ...)) return false;
    else return described_slot<slot>;
  }();
  using type = typename with_policy_slots<
      std::conditional_t<added, policy::slot_list<Slots..., slot>, policy::slot_list<Slots...>>, Policies...>::type;
};

// One slot's holder as a base of the trainer's holders, built in place (a policy need not be
// movable): from the optimizer when it is the optimizer's, else value-initialised.
template <class Slot, class H>
struct slot_holder {
  template <class O>
    requires std::is_constructible_v<H, O&&>
  explicit slot_holder(O&& o) : held(std::forward<O>(o)) {}
  template <class O>
    requires(!std::is_constructible_v<H, O &&>)
  explicit slot_holder(O&&) : held() {}
  H held;
};

template <class Slot, class... Slots>
constexpr std::size_t slot_index() {
  constexpr bool found[] = {std::is_same_v<Slot, Slots>...};
  for (std::size_t i = 0; i < sizeof...(Slots); ++i)
    if (found[i]) return i;
  return sizeof...(Slots);
}

// What a core is given: the part of every slot the core calls, by slot.
template <class Device, class List = trainer_slots>
class trainer_parts_ref;
template <class Device, class... Slots>
class trainer_parts_ref<Device, policy::slot_list<Slots...>> {
 public:
  template <class Holders>
    requires(!std::is_same_v<std::remove_cvref_t<Holders>, trainer_parts_ref>)
  explicit trainer_parts_ref(Holders& holders) : parts_(pointer_to<Slots>(holders.template of<Slots>())...) {}

  template <class Slot>
  auto& get() const noexcept {
    return *std::get<slot_index<Slot, Slots...>()>(parts_);
  }

 private:
  template <class Slot>
  using part_pointer = typename slot_descriptor<Slot>::template part<Device>*;
  template <class Slot, class H>
  static part_pointer<Slot> pointer_to(H& holder) {
    if constexpr (std::is_void_v<typename slot_descriptor<Slot>::template part<Device>>) return nullptr;
    else return &holder;
  }

  std::tuple<part_pointer<Slots>...> parts_;
};

// "slot=name, slot=name, ...", written once for every trainer type; a slot with no name is left out.
inline std::string describe_policies(std::initializer_list<std::pair<std::string_view, std::string>> slots) {
  std::string s;
  for (const auto& [slot, name] : slots)
    if (!name.empty()) s.append(s.empty() ? "" : ", ").append(slot).append("=").append(name);
  return s;
}

}  // namespace ddp::detail
