#pragma once
// A slot's policy chosen while the program runs, among a fixed list, inside one trainer type:
// each slot's one_of (comm_hook::one_of, buffer_sync::one_of, unused_params::one_of) derives
// from run_time_choice and forwards the slot's calls to the policy selected.
//
//   using sync = ddp::buffer_sync::one_of<ddp::buffer_sync::none, ddp::buffer_sync::broadcast_once_per_step>;
//   trainer.policy<ddp::buffer_sync::slot>().select(flag);   // before the first step, on every rank
//
// A program whose flags pick among N policies of a slot then compiles one trainer type, not N.
// The first policy listed is the initial choice. Every rank must select the same one (it decides
// which collectives a step issues). Checkpoints record the choice, so a resumed run must select
// what it was saved with. The trainer agrees on every rank's choice at its first step and at the
// first step after a select(): a choice that differs between ranks is an error naming the slot and
// each rank's policy (trainer/policy_agreement.hpp).
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace ddp::policy {

template <class Slot, class... Ps>
class run_time_choice {
  static_assert(sizeof...(Ps) > 0, "ddp: a one_of needs at least one policy to choose from");
  static_assert((std::is_same_v<typename Ps::slot, Slot> && ...),
                "ddp: every policy in a one_of must fill the one_of's slot");

 public:
  // The policy selected; std::get_if<P>(&chosen) reaches its own settings.
  std::variant<Ps...> chosen;

  // Replaces the choice with a fresh policy of that name (its state starts anew). Throws, naming
  // the choices, for a name not listed.
  void select(std::string_view name) {
    const bool found = ((Ps::name == name ? (chosen.template emplace<Ps>(), true) : false) || ...);
    if (!found)
      throw std::invalid_argument("ddp: " + std::string(Slot::name) + "::one_of has no policy named '" +
                                  std::string(name) + "'; choose one of " + names());
    ++selections_;
  }
  // How many times select() chose, whatever it chose (the trainer agrees again after a select).
  std::uint64_t selections() const noexcept { return selections_; }
  std::string_view selected() const {
    return std::visit([](const auto& p) -> std::string_view { return std::remove_cvref_t<decltype(p)>::name; }, chosen);
  }
  // The choice's name, which describes the trainer and its checkpoints.
  std::string describe() const { return std::string(selected()); }
  static std::string names() {
    std::string list;
    ((list += (list.empty() ? "" : ", ") + std::string(Ps::name)), ...);
    return list;
  }

 protected:
  template <class F>
  decltype(auto) visit(F&& f) {
    return std::visit(std::forward<F>(f), chosen);
  }
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit(std::forward<F>(f), chosen);
  }

 private:
  std::uint64_t selections_ = 0;
};

}  // namespace ddp::policy
