#pragma once
// Sorting a list of policies into slots at compile time.
//
// A policy is a type that names the slot it fills:   struct my_sync { using slot = ...; };
// A slot is a type with a name and a default:       struct buffer_sync_slot {
//                                                      static constexpr auto name = "buffer_sync";
//                                                      using default_policy = ...; };
// resolve<slot_list<S...>, P...> checks that every P fills one of the slots S and that no slot
// is filled twice, then hands out `get<S>`: the policy listed for S, or S's default.
// The policies may be listed in any order.
#include <cstddef>
#include <string_view>
#include <type_traits>

namespace ddp::policy {

template <class... Slots>
struct slot_list {};

template <class P>
concept policy = requires { typename P::slot; };

template <class P, class Slot>
concept policy_for = policy<P> && std::is_same_v<typename P::slot, Slot>;

namespace detail {

template <class P>
struct slot_of {
  using type = void;
};
template <policy P>
struct slot_of<P> {
  using type = typename P::slot;
};

template <class Slot, class... Ps>
inline constexpr std::size_t count_for = (std::size_t{policy_for<Ps, Slot>} + ... + 0);

template <class Slot, class... Ps>
struct first_for {
  using type = typename Slot::default_policy;
};
template <class Slot, class P, class... Ps>
struct first_for<Slot, P, Ps...> {
  using type =
      std::conditional_t<policy_for<P, Slot>, P, typename first_for<Slot, Ps...>::type>;
};

template <class T, class... Ts>
inline constexpr bool one_of = (std::is_same_v<T, Ts> || ...);

}  // namespace detail

// Each check is a template over the types at fault, so the compiler's "required from" line
// names them beside the message.
template <class NotAPolicy>
struct must_be_a_policy {
  static_assert(policy<NotAPolicy>,
                "ddp: a type listed as a policy has no `using slot = ...;`, so it fills no slot. "
                "List only ddp policies (ddp::buffer_sync::*, ddp::unused_params::*, "
                "ddp::sampler::*, ddp::bucket_cap<N>, ...) or give your own policy a slot.");
  static constexpr bool ok = policy<NotAPolicy>;
};

template <class Policy, class Slot, class... Accepted>
struct slot_must_be_accepted {
  static_assert(detail::one_of<Slot, Accepted...>,
                "ddp: this policy fills a slot that this type does not take; remove it, or use "
                "it where its slot is accepted.");
  static constexpr bool ok = detail::one_of<Slot, Accepted...>;
};

template <class Slot, class... Listed>
struct one_policy_per_slot {
  static_assert(detail::count_for<Slot, Listed...> <= 1,
                "ddp: two policies were given for one slot; keep one (each slot takes exactly "
                "one policy, and an empty slot takes its default).");
  static constexpr bool ok = detail::count_for<Slot, Listed...> <= 1;
};

template <class Slots, class... Ps>
struct resolve;

template <class... Slots, class... Ps>
struct resolve<slot_list<Slots...>, Ps...> {
  static constexpr bool all_policies = (must_be_a_policy<Ps>::ok && ...);
  static constexpr bool all_accepted =
      all_policies &&
      (slot_must_be_accepted<Ps, typename detail::slot_of<Ps>::type, Slots...>::ok && ...);
  static constexpr bool unique = (one_policy_per_slot<Slots, Ps...>::ok && ...);
  static constexpr bool valid = all_policies && all_accepted && unique;

  template <class Slot>
    requires detail::one_of<Slot, Slots...>
  using get = typename detail::first_for<Slot, Ps...>::type;
};

}  // namespace ddp::policy
