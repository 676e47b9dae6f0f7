#pragma once
// The trainer's policies as its core sees them: one small interface per slot, implemented once
// per policy by an adapter that forwards to the policy's own code. The core (trainer_core.hpp)
// is compiled once per module, communicator and device, whatever the policies: a program with
// three buffer-sync policies and two optimizers instantiates 3 + 2 adapters and one core, not
// 3 x 2 trainers. The per-element work (an optimizer's rule) stays a template inside its
// adapter; what crosses the interface is a call per bucket or per step.
#include <concepts>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "ddp/core/segment.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/optim/parameter_group.hpp"
#include "ddp/policy/bucket_cap.hpp"
#include "ddp/policy/buffer_sync.hpp"
#include "ddp/policy/comm_hook.hpp"
#include "ddp/policy/reduction.hpp"
#include "ddp/policy/sync_schedule.hpp"
#include "ddp/policy/unused_params.hpp"
#include "ddp/policy/update.hpp"

namespace ddp::detail {

// A policy's name, or for a run-time choice (a one_of) the name of the policy it chose.
template <class P>
std::string_view policy_name(const P& p) noexcept {
  if constexpr (requires { p.selected(); }) return p.selected();
  else return P::name;
}

struct buffer_sync_part {
  virtual std::string_view name() const noexcept = 0;
  virtual void prepare(buffer_sync::context&) = 0;
  virtual void before_forward(buffer_sync::context&) = 0;
  virtual void synchronize(buffer_sync::context&) = 0;

 protected:
  ~buffer_sync_part() = default;
};

template <buffer_sync::policy P>
struct buffer_sync_adapter final : buffer_sync_part {
  P policy;
  std::string_view name() const noexcept override { return policy_name(policy); }
  void prepare(buffer_sync::context& c) override {
    if constexpr (requires { policy.prepare(c); }) policy.prepare(c);
  }
  void before_forward(buffer_sync::context& c) override { policy.before_forward(c); }
  void synchronize(buffer_sync::context& c) override { policy.synchronize(c); }
};

struct unused_params_part {
  virtual std::string_view name() const noexcept = 0;
  virtual std::size_t control_floats(std::size_t parameters) const = 0;
  virtual void write_control(const unused_params::step_view&, std::span<float>) = 0;
  virtual void after_reduction(unused_params::step_view&, std::span<const float>, std::span<char>) = 0;
  virtual bool expects_gradient(std::size_t i) const = 0;
  virtual void on_unexpected_gradient(unused_params::step_view&, std::size_t i) = 0;

 protected:
  ~unused_params_part() = default;
};

template <unused_params::policy P>
struct unused_params_adapter final : unused_params_part {
  P policy;
  std::string_view name() const noexcept override { return policy_name(policy); }
  std::size_t control_floats(std::size_t n) const override { return policy.control_floats(n); }
  void write_control(const unused_params::step_view& v, std::span<float> c) override { policy.write_control(v, c); }
  void after_reduction(unused_params::step_view& v, std::span<const float> a, std::span<char> u) override {
    policy.after_reduction(v, a, u);
  }
  bool expects_gradient(std::size_t i) const override {
    if constexpr (requires { policy.expects_gradient(i); }) return policy.expects_gradient(i);
    else return true;
  }
  void on_unexpected_gradient(unused_params::step_view& v, std::size_t i) override {
    if constexpr (requires { policy.on_unexpected_gradient(v, i); }) policy.on_unexpected_gradient(v, i);
  }
};

struct update_part {
  virtual std::string_view name() const noexcept = 0;
  // Which parameters and gradients a rank keeps, and when (ddp/policy/update.hpp).
  virtual update::memory_plan memory() const noexcept = 0;
  virtual update::layout plan(std::size_t numel, int rank, int ranks) const = 0;

 protected:
  ~update_part() = default;
};

template <update::policy P>
struct update_adapter final : update_part {
  P policy;
  std::string_view name() const noexcept override { return policy_name(policy); }
  update::memory_plan memory() const noexcept override { return P::memory; }
  update::layout plan(std::size_t numel, int rank, int ranks) const override { return policy.plan(numel, rank, ranks); }
};

// Over the device, so that a hook may use it (comm_hook::bucket_io_on<Device>).
template <class Device>
struct comm_hook_part {
  virtual std::string_view name() const noexcept = 0;
  // Device work and collectives only, the same every step: a CUDA graph may hold it.
  virtual bool capturable() const noexcept = 0;
  // The hook in use leaves the gradients to the update policy's collective (comm_hook::is_plain):
  // it goes unnamed where the trainer describes itself.
  virtual bool plain() const noexcept = 0;
  virtual void reduce(comm_hook::bucket_io_on<Device>&) = 0;
  virtual void finish(comm_hook::bucket_io_on<Device>&) = 0;

 protected:
  ~comm_hook_part() = default;
};

template <comm_hook::policy P, class Device>
struct comm_hook_adapter final : comm_hook_part<Device> {
  P policy;
  std::string_view name() const noexcept override { return policy_name(policy); }
  bool capturable() const noexcept override {
    if constexpr (requires { { P::capturable } -> std::convertible_to<bool>; }) return P::capturable;
    else return false;
  }
  bool plain() const noexcept override {
    if constexpr (requires { policy.selected_plain(); }) return policy.selected_plain();
    else return comm_hook::is_plain<P>();
  }
  void reduce(comm_hook::bucket_io_on<Device>& b) override { policy.reduce(b); }
  void finish(comm_hook::bucket_io_on<Device>& b) override { policy.finish(b); }
};

struct reduction_part {
  virtual std::string_view name() const noexcept = 0;
  // 0: the plain floating-point average; V: the exact sum over V micro-batches.
  virtual std::size_t virtual_shards() const noexcept = 0;

 protected:
  ~reduction_part() = default;
};

template <reduction::policy P>
struct reduction_adapter final : reduction_part {
  P policy;
  std::string_view name() const noexcept override { return policy_name(policy); }
  std::size_t virtual_shards() const noexcept override { return P::virtual_shards; }
};

struct bucket_part {
  virtual bucket_plan plan(std::span<const std::size_t> numels) const = 0;

 protected:
  ~bucket_part() = default;
};

template <buckets::policy P>
struct bucket_adapter final : bucket_part {
  P policy;
  bucket_plan plan(std::span<const std::size_t> numels) const override { return policy.plan(numels); }
};

template <class Device>
struct optimizer_part {
  virtual int state_slots() const noexcept = 0;
  virtual float& learning_rate() noexcept = 0;
  virtual bool applies_update() const noexcept = 0;
  virtual bool has_weight_decay() const noexcept = 0;
  // Whether the rule of an update depends on the update count (AdamW's bias correction); none
  // when the rule has no operator== to tell.
  virtual std::optional<bool> rule_varies_with_step() const = 0;
  // The rule of each parameter's `step`-th update over `segments`; state slot k of an element at
  // state + k * stride + its offset.
  // group: a parameter group's options over the optimizer's (nullptr: the optimizer's own).
  virtual void update(Device&, std::span<const segment> segments, const float* grad, float* state,
                      std::size_t stride, std::int64_t step, const optim::parameter_group* group) = 0;

 protected:
  ~optimizer_part() = default;
};

template <optim::optimizer O, class Device>
struct optimizer_adapter final : optimizer_part<Device> {
  explicit optimizer_adapter(O o = {}) : policy(std::move(o)) {}
  O policy;
  int state_slots() const noexcept override { return O::state_slots; }
  float& learning_rate() noexcept override { return policy.lr; }
  bool applies_update() const noexcept override { return optim::applies_update<O>(); }
  bool has_weight_decay() const noexcept override { return requires(O& o) { o.weight_decay = 0.0f; }; }
  std::optional<bool> rule_varies_with_step() const override {
    if constexpr (!optim::applies_update<O>()) {
      return false;
    } else if constexpr (std::equality_comparable<optim::rule_of<O>>) {
      const auto first = policy.at(1);
      return !(first == policy.at(2) && first == policy.at(1000));
    } else {
      return std::nullopt;
    }
  }
  void update(Device& dev, std::span<const segment> segments, const float* grad, float* state, std::size_t stride,
              std::int64_t step, const optim::parameter_group* group) override {
    if constexpr (optim::applies_update<O>()) {
      if (!group) {
        dev.template elementwise<O::state_slots>(segments, grad, state, stride, policy.at(step));
        return;
      }
      O grouped = policy;
      grouped.lr *= group->lr_scale;
      if constexpr (requires(O& o) { o.weight_decay = 0.0f; })
        if (group->weight_decay) grouped.weight_decay = *group->weight_decay;
      dev.template elementwise<O::state_slots>(segments, grad, state, stride, grouped.at(step));
    }
  }
};

// Over the device: the outer optimizer's element rule runs there.
template <class Device>
struct sync_schedule_part {
  virtual std::string_view name() const noexcept = 0;
  virtual bool every_step() const noexcept = 0;
  virtual bool reduces_gradients(std::uint64_t step) const = 0;
  virtual sync_schedule::action after_update(std::uint64_t step) const = 0;
  // The outer optimizer's state values per element; -1: the schedule keeps no anchor.
  virtual int outer_state_slots() const noexcept = 0;
  // The outer optimizer's `step`-th update of the anchor (segments) with the averaged
  // pseudo-gradient `grad`; state slot k of an element at state + k * stride + its offset.
  virtual void outer_update(Device&, std::span<const segment> anchor, const float* grad, float* state,
                            std::size_t stride, std::int64_t step) = 0;
  // Streaming (sync_schedule::streaming_diloco): the fragments (0: the schedule syncs the whole
  // model, by after_update), the one whose sync starts after step `step`, the steps until it is
  // applied, and the local parameters' share then.
  virtual std::size_t fragments() const noexcept = 0;
  virtual std::optional<std::size_t> fragment_due(std::uint64_t step) const = 0;
  virtual std::size_t delay() const noexcept = 0;
  virtual float mixing() const noexcept = 0;

 protected:
  ~sync_schedule_part() = default;
};

template <sync_schedule::policy P, class Device>
struct sync_schedule_adapter final : sync_schedule_part<Device> {
  P policy;
  std::string_view name() const noexcept override { return policy_name(policy); }
  bool every_step() const noexcept override { return sync_schedule::syncs_every_step<P>(); }
  bool reduces_gradients(std::uint64_t step) const override { return policy.reduces_gradients(step); }
  sync_schedule::action after_update(std::uint64_t step) const override { return policy.after_update(step); }
  int outer_state_slots() const noexcept override {
    if constexpr (sync_schedule::has_outer<P>) return std::remove_cvref_t<decltype(policy.outer)>::state_slots;
    else return -1;
  }
  void outer_update(Device& dev, std::span<const segment> anchor, const float* grad, float* state, std::size_t stride,
                    std::int64_t step) override {
    if constexpr (sync_schedule::has_outer<P>) {
      constexpr int slots = std::remove_cvref_t<decltype(policy.outer)>::state_slots;
      dev.template elementwise<slots>(anchor, grad, state, stride, policy.outer.at(step));
    } else {
      throw std::logic_error("ddp: sync schedule '" + std::string(name()) +
                             "' asked for an outer step but declares no `outer` optimizer");
    }
  }
  std::size_t fragments() const noexcept override {
    if constexpr (sync_schedule::streams_fragments<P>) return policy.fragments;
    else return 0;
  }
  std::optional<std::size_t> fragment_due(std::uint64_t step) const override {
    if constexpr (sync_schedule::streams_fragments<P>) return policy.fragment_due(step);
    else return std::nullopt;
  }
  std::size_t delay() const noexcept override {
    if constexpr (sync_schedule::streams_fragments<P>) return policy.delay;
    else return 0;
  }
  float mixing() const noexcept override {
    if constexpr (sync_schedule::streams_fragments<P>) return policy.mixing;
    else return 0.0f;
  }
};

}  // namespace ddp::detail
