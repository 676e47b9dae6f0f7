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
//   unchecked          every parameter counts as used, nothing is checked: for a module that
//                      cannot report ready gradients. A parameter no rank used is updated with a
//                      zero gradient (weight decay and momentum still move it); no rank hangs.
//   one_of<P...>       one of the policies P, chosen while the program runs (select(name)).
// Every policy but unchecked needs a module that reports ready gradients: without reports an
// unused parameter cannot be told apart, so forbid would pass it silently.
//
// A policy of this slot is a type with
//   using slot = ddp::unused_params::slot;  static constexpr std::string_view name;
//   static constexpr bool needs_ready_reports;   // true: the module must report ready gradients
//   std::size_t control_floats(std::size_t parameters) const;
//        // floats the policy sends along with the step's last gradient bucket; the trainer
//        // averages them over the ranks
//   void write_control(const ddp::unused_params::step_view&, std::span<float> control);
//        // this rank's control floats, written just before the last bucket is reduced
//   void after_reduction(ddp::unused_params::step_view&, std::span<const float> averaged,
//                        std::span<char> update);
//        // the averaged floats are equal on every rank: decide which parameters the optimizer
//        // updates (update[i], kept from step to step), or throw ddp::collective_error on every
//        // rank alike
// and optionally
//   bool expects_gradient(std::size_t i) const;   // false: parameter i's bucket does not wait
//                                                 // for it (default: true)
//   void on_unexpected_gradient(ddp::unused_params::step_view&, std::size_t i);
//        // a parameter reported ready although expects_gradient(i) was false
//
// Example (written outside the library): detect_each_step that also logs what went unused.
//   struct log_unused : ddp::unused_params::detect_each_step {
//     static constexpr std::string_view name = "log_unused";
//     void after_reduction(ddp::unused_params::step_view& v, std::span<const float> avg,
//                          std::span<char> update) {
//       detect_each_step::after_reduction(v, avg, update);
//       for (std::size_t i = 0; i < update.size(); ++i)
//         if (!update[i]) std::fprintf(stderr, "unused: %s\n", v.parameter_name(i).c_str());
//     }
//   };
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/policy/one_of.hpp"
#include "ddp/policy/slots.hpp"

namespace ddp::policy::unused_params {

struct slot;

// What the trainer tells a policy about the current step.
class step_view {
 public:
  virtual std::size_t parameter_count() const noexcept = 0;
  virtual const std::string& parameter_name(std::size_t i) const = 0;
  // Parameter i got a gradient on this rank in this step (in any of its backwards).
  virtual bool used(std::size_t i) const noexcept = 0;
  // The step's last gradient bucket has gone to the reduction: the control floats are sent.
  virtual bool all_buckets_sent() const noexcept = 0;
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  // Collective: every rank's `mine` (the same length on every rank), rank after rank.
  virtual std::vector<std::uint8_t> all_gather(std::span<const std::uint8_t> mine) = 0;

 protected:
  ~step_view() = default;
};

template <class P>
concept policy = requires(P& p, const P& cp, step_view& v, std::span<float> c, std::span<const float> a,
                          std::span<char> u) {
  requires std::same_as<typename P::slot, slot>;
  { P::name } -> std::convertible_to<std::string_view>;
  { P::needs_ready_reports } -> std::convertible_to<bool>;
  { cp.control_floats(std::size_t{}) } -> std::convertible_to<std::size_t>;
  p.write_control(std::as_const(v), c);
  p.after_reduction(v, a, u);
};

namespace detail {
// "\n  'name' (what on rank(s) 0, 2)" for each parameter that `problem(row, i)` flags on some
// rank, where row is a rank's gathered bytes.
template <class Problem>
std::string list_by_rank(step_view& v, const std::vector<std::uint8_t>& all, std::size_t row_bytes,
                         const std::string& what, Problem problem) {
  std::string list;
  for (std::size_t i = 0; i < v.parameter_count(); ++i) {
    std::string ranks;
    for (int r = 0; r < v.size(); ++r)  // a world of one: this rank's own step (a local step)
      if (problem(all.data() + static_cast<std::size_t>(r) * row_bytes, i))
        ranks += (ranks.empty() ? "" : ", ") + std::to_string(v.size() == 1 ? v.rank() : r);
    if (!ranks.empty()) list += "\n  '" + v.parameter_name(i) + "' (" + what + " on rank(s) " + ranks + ")";
  }
  return list;
}
inline std::vector<std::uint8_t> used_flags(const step_view& v) {
  std::vector<std::uint8_t> used(v.parameter_count());
  for (std::size_t i = 0; i < used.size(); ++i) used[i] = v.used(i);
  return used;
}
}  // namespace detail

struct forbid {
  using slot = unused_params::slot;
  static constexpr std::string_view name = "forbid";
  static constexpr bool needs_ready_reports = true;

  // One float: how many parameters this rank left without a gradient.
  std::size_t control_floats(std::size_t) const { return 1; }
  void write_control(const step_view& v, std::span<float> control) {
    std::size_t unused = 0;
    for (std::size_t i = 0; i < v.parameter_count(); ++i) unused += !v.used(i);
    control[0] = static_cast<float>(unused);
  }
  void after_reduction(step_view& v, std::span<const float> averaged, std::span<char>) {
    if (averaged[0] == 0.0f) return;
    // Slow path: name each parameter and the ranks that skipped it, on every rank.
    const auto mine = detail::used_flags(v);
    const auto all = v.all_gather(mine);
    const auto list = detail::list_by_rank(v, all, mine.size(), "no gradient",
                                           [](const std::uint8_t* row, std::size_t i) { return !row[i]; });
    throw collective_error("trainer", "step", v.rank(),
                           "parameters received no gradient in this step (pitfall P2):" + list +
                               "\nWith unused_params::forbid every parameter must get a gradient on every "
                               "rank in every step. Use ddp::unused_params::detect_each_step when the set "
                               "of used parameters changes between steps, or "
                               "ddp::unused_params::static_graph when it is fixed.");
  }
};

struct detect_each_step {
  using slot = unused_params::slot;
  static constexpr std::string_view name = "detect_each_step";
  static constexpr bool needs_ready_reports = true;

  // A problem count (always 0 here), then one used flag per parameter.
  std::size_t control_floats(std::size_t parameters) const { return parameters + 1; }
  void write_control(const step_view& v, std::span<float> control) {
    control[0] = 0.0f;
    for (std::size_t i = 0; i < v.parameter_count(); ++i) control[1 + i] = v.used(i) ? 1.0f : 0.0f;
  }
  // A parameter some rank used is updated (its gradient averaged over all ranks); one no rank
  // used keeps its value and optimizer state.
  void after_reduction(step_view&, std::span<const float> averaged, std::span<char> update) {
    for (std::size_t i = 0; i < update.size(); ++i) update[i] = averaged[1 + i] > 0.0f;
  }
};

struct static_graph {
  using slot = unused_params::slot;
  static constexpr std::string_view name = "static_graph";
  static constexpr bool needs_ready_reports = true;

  std::size_t control_floats(std::size_t parameters) const { return parameters + 1; }
  // A problem count (parameters whose use differs from the learned set), then used flags.
  void write_control(const step_view& v, std::span<float> control) {
    std::size_t changed = 0;
    if (learned_)
      for (std::size_t i = 0; i < v.parameter_count(); ++i) changed += v.used(i) != (learned_used_[i] != 0);
    control[0] = static_cast<float>(changed);
    for (std::size_t i = 0; i < v.parameter_count(); ++i) control[1 + i] = v.used(i) ? 1.0f : 0.0f;
  }
  void after_reduction(step_view& v, std::span<const float> averaged, std::span<char> update) {
    if (averaged[0] > 0.0f) report_change(v);
    if (learned_) return;
    for (std::size_t i = 0; i < update.size(); ++i) update[i] = averaged[1 + i] > 0.0f;
    learned_used_ = detail::used_flags(v);
    learned_ = true;
  }
  // After the first step, buckets do not wait for the parameters it learned are unused.
  bool expects_gradient(std::size_t i) const { return !learned_ || learned_used_[i]; }
  // Such a parameter got a gradient: counted as a change while the last bucket has not gone;
  // after that the peers cannot learn it through the reduction, so this rank fails alone.
  void on_unexpected_gradient(step_view& v, std::size_t i) {
    if (v.all_buckets_sent())
      throw error("trainer", "backward", v.rank(),
                  "parameter '" + v.parameter_name(i) + "' got a gradient, but "
                  "unused_params::static_graph learned in the first step that it is unused; "
                  "use ddp::unused_params::detect_each_step when the set of used parameters "
                  "changes between steps");
  }

 private:
  [[noreturn]] void report_change(step_view& v) const {
    const std::size_t n = v.parameter_count();
    auto mine = detail::used_flags(v);
    mine.insert(mine.end(), learned_used_.begin(), learned_used_.end());
    const auto all = v.all_gather(mine);
    const auto list = detail::list_by_rank(v, all, mine.size(), "use changed", [n](const std::uint8_t* row, std::size_t i) {
      return (row[i] != 0) != (row[n + i] != 0);
    });
    throw collective_error("trainer", "step", v.rank(),
                           "the set of used parameters changed after the first step, which "
                           "unused_params::static_graph learned it in:" + list +
                               "\nUse ddp::unused_params::detect_each_step when the set changes between steps.");
  }

  bool learned_ = false;
  std::vector<std::uint8_t> learned_used_;
};

struct unchecked {
  using slot = unused_params::slot;
  static constexpr std::string_view name = "unchecked";
  static constexpr bool needs_ready_reports = false;
  std::size_t control_floats(std::size_t) const { return 0; }
  void write_control(const step_view&, std::span<float>) {}
  void after_reduction(step_view&, std::span<const float>, std::span<char>) {}  // every parameter is updated
};

// One of several policies, chosen while the program runs (ddp/policy/one_of.hpp), in one trainer
// type: `trainer.policy<ddp::unused_params::slot>().select("detect_each_step")` before the first
// step. The buckets are planned once, so the control floats have room for any choice; the
// chosen policy uses a prefix.
template <policy... Ps>
struct one_of : ddp::policy::run_time_choice<unused_params::slot, Ps...> {
  using slot = unused_params::slot;
  static constexpr std::string_view name = "one_of";
  // The module reports ready gradients when any choice needs it.
  static constexpr bool needs_ready_reports = (Ps::needs_ready_reports || ...);

  std::size_t control_floats(std::size_t parameters) const {
    std::size_t most = 0;
    ((most = std::max(most, Ps{}.control_floats(parameters))), ...);
    return most;
  }
  void write_control(const step_view& v, std::span<float> control) {
    this->visit([&](auto& p) {
      const std::size_t used = p.control_floats(v.parameter_count());
      std::fill(control.begin() + static_cast<std::ptrdiff_t>(used), control.end(), 0.0f);
      p.write_control(v, control.first(used));
    });
  }
  void after_reduction(step_view& v, std::span<const float> averaged, std::span<char> update) {
    this->visit([&](auto& p) { p.after_reduction(v, averaged.first(p.control_floats(v.parameter_count())), update); });
  }
  bool expects_gradient(std::size_t i) const {
    return this->visit([&](const auto& p) {
      if constexpr (requires { p.expects_gradient(i); }) return static_cast<bool>(p.expects_gradient(i));
      else return true;
    });
  }
  void on_unexpected_gradient(step_view& v, std::size_t i) {
    this->visit([&](auto& p) {
      if constexpr (requires { p.on_unexpected_gradient(v, i); }) p.on_unexpected_gradient(v, i);
    });
  }
};

struct slot {
  static constexpr std::string_view name = "unused_params";
  using default_policy = forbid;
};

template <class P>
consteval bool diagnose() {
  static_assert(requires { { P::name } -> std::convertible_to<std::string_view>; },
                "ddp: a policy in the unused_params slot lacks `static constexpr std::string_view name`");
  static_assert(requires { { P::needs_ready_reports } -> std::convertible_to<bool>; },
                "ddp: a policy in the unused_params slot lacks `static constexpr bool needs_ready_reports` "
                "(true when it needs a module that reports ready gradients)");
  static_assert(requires(const P& p) { { p.control_floats(std::size_t{}) } -> std::convertible_to<std::size_t>; },
                "ddp: a policy in the unused_params slot lacks `std::size_t control_floats(std::size_t "
                "parameters) const` (see ddp/policy/unused_params.hpp)");
  static_assert(requires(P& p, const step_view& v, std::span<float> c) { p.write_control(v, c); },
                "ddp: a policy in the unused_params slot lacks `void write_control(const "
                "ddp::unused_params::step_view&, std::span<float>)`");
  static_assert(requires(P& p, step_view& v, std::span<const float> a, std::span<char> u) {
                  p.after_reduction(v, a, u);
                },
                "ddp: a policy in the unused_params slot lacks `void after_reduction(ddp::unused_params::step_view&, "
                "std::span<const float> averaged, std::span<char> update)`");
  return policy<P>;
}

}  // namespace ddp::policy::unused_params

// The slot's short spelling, as policy lists write it: ddp::unused_params::... is ddp::policy::unused_params::...
namespace ddp {
namespace unused_params = policy::unused_params;
}  // namespace ddp
