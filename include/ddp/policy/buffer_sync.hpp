#pragma once
// BufferSync: how module buffers (running statistics, counters) are kept equal across ranks.
//
//   none                      buffers stay per rank; no communication.
//   broadcast_each_forward    rank 0's buffers are broadcast before every forward (PyTorch's
//                             broadcast_buffers=True). A backward that still needs a buffer an
//                             intervening broadcast overwrote is reported by name.
//   broadcast_once_per_step   rank 0's buffers are broadcast once, before the step's first
//                             forward. Any number of forwards per step is safe. The default.
//   average_once_per_step     before the first forward, floating buffers are averaged over the
//                             ranks and integer buffers broadcast from rank 0.
//   one_of<P...>              one of the policies P, chosen while the program runs (select(name)).
//
// A policy of this slot is a type with
//   using slot = ddp::buffer_sync::slot;  static constexpr std::string_view name;
//   void before_forward(ddp::buffer_sync::context&);  // before every forward of a step
//   void synchronize(ddp::buffer_sync::context&);     // trainer.synchronize_buffers(), e.g.
//                                                      // before evaluating
// and optionally `void prepare(ddp::buffer_sync::context&)`, run once at construction (check the
// buffers suit the policy there). The context's operations are collectives: every rank must make
// the same calls, so decide from what every rank knows alike (the step, the forward's index).
// The trainer bumps the version of every buffer an operation overwrites; the check of saved buffers then
// names a buffer a pending backward still needed.
//
//   struct every_k_steps {                       // written outside the library
//     using slot = ddp::buffer_sync::slot;
//     static constexpr std::string_view name = "every_k_steps";
//     std::uint64_t k = 4;
//     void before_forward(ddp::buffer_sync::context& c) {
//       if (c.forward_index() == 0 && c.step() % k == 0) c.broadcast_buffers(0);
//     }
//     void synchronize(ddp::buffer_sync::context& c) { c.broadcast_buffers(0); }
//   };
#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "ddp/policy/one_of.hpp"
#include "ddp/policy/slots.hpp"

namespace ddp::policy::buffer_sync {

struct slot;

// What a buffer-sync policy may do; the trainer provides it.
class context {
 public:
  // Steps the trainer finished before the current one.
  virtual std::uint64_t step() const noexcept = 0;
  // Forwards run since the last update, accumulate() micro-batches included (0 before the
  // step's first forward).
  virtual std::size_t forward_index() const noexcept = 0;
  // Collective: every buffer takes `root`'s value.
  virtual void broadcast_buffers(int root) = 0;
  // Collective: floating buffers (f32, f64) take the mean over the ranks, the others rank 0's.
  virtual void average_buffers() = 0;
  // Construction: throws, naming the buffer, unless average_buffers() can average every
  // floating buffer.
  virtual void require_averageable() = 0;

 protected:
  ~context() = default;
};

template <class P>
concept policy = requires(P& p, context& c) {
  requires std::same_as<typename P::slot, slot>;
  { P::name } -> std::convertible_to<std::string_view>;
  p.before_forward(c);
  p.synchronize(c);
};

struct none {
  using slot = buffer_sync::slot;
  static constexpr std::string_view name = "none";
  void before_forward(context&) {}
  void synchronize(context&) {}
};

struct broadcast_each_forward {
  using slot = buffer_sync::slot;
  static constexpr std::string_view name = "broadcast_each_forward";
  void before_forward(context& c) { c.broadcast_buffers(0); }
  void synchronize(context& c) { c.broadcast_buffers(0); }
};

struct broadcast_once_per_step {
  using slot = buffer_sync::slot;
  static constexpr std::string_view name = "broadcast_once_per_step";
  void before_forward(context& c) {
    if (c.forward_index() == 0) c.broadcast_buffers(0);
  }
  void synchronize(context& c) { c.broadcast_buffers(0); }
};

struct average_once_per_step {
  using slot = buffer_sync::slot;
  static constexpr std::string_view name = "average_once_per_step";
  void prepare(context& c) { c.require_averageable(); }
  void before_forward(context& c) {
    if (c.forward_index() == 0) c.average_buffers();
  }
  void synchronize(context& c) { c.average_buffers(); }
};

// One of several policies, chosen while the program runs (ddp/policy/one_of.hpp), in one trainer
// type: `trainer.policy<ddp::buffer_sync::slot>().select("none")` before the first step. The
// chosen policy's prepare runs before its first use, so a choice it refuses fails there.
template <policy... Ps>
struct one_of : ddp::policy::run_time_choice<buffer_sync::slot, Ps...> {
  using slot = buffer_sync::slot;
  static constexpr std::string_view name = "one_of";
  void select(std::string_view policy_name) {
    ddp::policy::run_time_choice<buffer_sync::slot, Ps...>::select(policy_name);
    prepared_ = false;
  }
  void prepare(context& c) {
    this->visit([&](auto& p) {
      if constexpr (requires { p.prepare(c); }) p.prepare(c);
    });
    prepared_ = true;
  }
  void before_forward(context& c) {
    if (!prepared_) prepare(c);
    this->visit([&](auto& p) { p.before_forward(c); });
  }
  void synchronize(context& c) {
    if (!prepared_) prepare(c);
    this->visit([&](auto& p) { p.synchronize(c); });
  }

 private:
  bool prepared_ = false;
};

// The policies reduction::invariant refuses: a collective per forward (ranks run as many forwards
// as they hold shards) or an average (which can change the last bit of equal buffers). A one_of is
// refused when it could choose one.
template <class P>
inline constexpr bool refused_under_invariant =
    std::is_same_v<P, broadcast_each_forward> || std::is_same_v<P, average_once_per_step>;
template <class... Ps>
inline constexpr bool refused_under_invariant<one_of<Ps...>> = (refused_under_invariant<Ps> || ...);

struct slot {
  static constexpr std::string_view name = "buffer_sync";
  using default_policy = broadcast_once_per_step;
};

// The slot's check, with one message per missing member (the trainer calls it).
template <class P>
consteval bool diagnose() {
  static_assert(requires { { P::name } -> std::convertible_to<std::string_view>; },
                "ddp: a policy in the buffer_sync slot lacks `static constexpr std::string_view name`");
  static_assert(requires(P& p, context& c) { p.before_forward(c); },
                "ddp: a policy in the buffer_sync slot lacks `void before_forward(ddp::buffer_sync::context&)` "
                "(what to do before each forward; see ddp/policy/buffer_sync.hpp)");
  static_assert(requires(P& p, context& c) { p.synchronize(c); },
                "ddp: a policy in the buffer_sync slot lacks `void synchronize(ddp::buffer_sync::context&)` "
                "(what trainer.synchronize_buffers() does; see ddp/policy/buffer_sync.hpp)");
  return policy<P>;
}

}  // namespace ddp::policy::buffer_sync

// The slot's short spelling, as policy lists write it: ddp::buffer_sync::... is ddp::policy::buffer_sync::...
namespace ddp {
namespace buffer_sync = policy::buffer_sync;
}  // namespace ddp
