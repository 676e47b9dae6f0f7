#pragma once
// The trainer policies the examples select by flag, and the one place that turns those flags into
// a trainer type. Slots chosen at compile time (reduction, update, sampler, optimizer) pick the
// trainer's type; --hook, --buffer-sync and --unused-params are chosen at run time inside that
// type (a one_of, ddp/policy/one_of.hpp), so they do not multiply the combinations compiled.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "ddp/ddp.hpp"
#include "ddp/policy/int8_rows.hpp"
#include "ddp/policy/powersgd.hpp"
#include "policy_flags.hpp"

namespace examples {

using hook_choice = ddp::comm_hook::one_of<ddp::comm_hook::none, ddp::comm_hook::bf16, ddp::comm_hook::fp16,
                                           ddp::comm_hook::powersgd<4>, ddp::comm_hook::int8_rows>;
using buffer_sync_choice =
    ddp::buffer_sync::one_of<ddp::buffer_sync::broadcast_once_per_step, ddp::buffer_sync::none,
                             ddp::buffer_sync::broadcast_each_forward, ddp::buffer_sync::average_once_per_step>;
// reduction::invariant refuses a collective per forward and the average: the choice leaves them out.
using invariant_buffer_sync_choice =
    ddp::buffer_sync::one_of<ddp::buffer_sync::broadcast_once_per_step, ddp::buffer_sync::none>;
using unused_params_choice = ddp::unused_params::one_of<ddp::unused_params::forbid, ddp::unused_params::detect_each_step,
                                                        ddp::unused_params::static_graph>;

// --sync local_sgd / diloco / streaming_diloco with --sync-period: a schedule of the example's
// own, chosen at run time inside one trainer type (ddp's local_sgd<H>, diloco<H> and
// streaming_diloco<H, F, Delay> fix those at compile time, and take the same steps).
struct sync_choice {
  using slot = ddp::sync_schedule::slot;
  static constexpr std::string_view name = "sync_choice";
  std::string kind = "diloco";
  std::uint64_t period = 32, warmup = 0;
  ddp::optim::sgd outer = ddp::sync_schedule::nesterov_outer;
  std::size_t fragments = 0, delay = 0;  // streaming_diloco's
  float mixing = 0.0f;
  bool reduces_gradients(std::uint64_t step) const { return kind == "local_sgd" && step < warmup; }
  ddp::sync_schedule::action after_update(std::uint64_t step) const {
    using ddp::sync_schedule::action;
    if (kind == "streaming_diloco") return action::none;
    if (kind == "diloco") return (step + 1) % period == 0 ? action::outer_step : action::none;
    if (step < warmup || (step - warmup + 1) % period != 0) return action::none;
    return action::average_parameters;
  }
  std::optional<std::size_t> fragment_due(std::uint64_t step) const {
    for (std::size_t f = 0; f < fragments; ++f)
      if ((step + 1) % period == f * period / fragments) return f;
    return std::nullopt;
  }
  std::string describe() const {
    if (kind == "local_sgd") return "local_sgd(" + std::to_string(period) + ", warmup " + std::to_string(warmup) + ")";
    std::string s = kind + "(" + std::to_string(period);
    if (kind == "streaming_diloco")
      s += ", " + std::to_string(fragments) + " fragments, delay " + std::to_string(delay) + ", mixing " +
           std::to_string(mixing);
    return s + ", outer " + outer.describe() + ")";
  }
};

inline void select_hook(hook_choice& hook, const policy_flags& c) {
  hook.select(c.hook == "powersgd" ? ddp::comm_hook::powersgd<4>::name : std::string_view(c.hook));
  if (auto* low_rank = std::get_if<ddp::comm_hook::powersgd<4>>(&hook.chosen)) low_rank->start_after = c.hook_start;
}

// The run-time choices of a trainer made by with_trainer_type: --hook, --buffer-sync, --unused-params.
template <class Trainer>
void select_run_time_policies(Trainer& trainer, const policy_flags& c) {
  if constexpr (std::is_same_v<typename Trainer::comm_hook_policy, hook_choice>)
    select_hook(trainer.template policy<ddp::comm_hook::slot>(), c);
  trainer.template policy<ddp::buffer_sync::slot>().select(c.buffer_sync);
  trainer.template policy<ddp::unused_params::slot>().select(c.unused_params);
  if constexpr (std::is_same_v<typename Trainer::sync_schedule_policy, sync_choice>) {
    auto& schedule = trainer.template policy<ddp::sync_schedule::slot>();
    schedule.kind = c.sync;
    schedule.period = c.sync_period;
    schedule.warmup = c.sync_warmup;
    schedule.outer.lr = c.outer_lr;
    schedule.outer.momentum = c.outer_momentum;
    if (c.sync == "streaming_diloco") {
      if (c.sync_fragments == 0 || c.sync_fragments > c.sync_period || c.sync_delay >= c.sync_period)
        throw std::invalid_argument("--sync streaming_diloco: give 1 to --sync-period fragments and a delay below "
                                    "the period");
      schedule.fragments = c.sync_fragments;
      schedule.delay = c.sync_delay;
      schedule.mixing = c.sync_mixing;
    }
  }
}

// --precision: the model's parameters in f32, or in bf16 / f16 with the trainer's f32 master copy.
template <class Model>
void set_precision(Model& m, const std::string& precision) {
  const ddp::dtype t = precision == "bf16" ? ddp::dtype::bf16 : precision == "f16" ? ddp::dtype::f16 : ddp::dtype::f32;
  if constexpr (requires { m.cast_parameters(t); }) {
    if (t != ddp::dtype::f32) m.cast_parameters(t);
  } else if (t != ddp::dtype::f32) {
    throw std::invalid_argument("--precision " + precision + ": this platform's model keeps f32 parameters; 16-bit "
                                "parameters need the reference layers (--device cpu or cuda)");
  }
}

template <class Model, class F>
void with_update(const std::string& name, F f) {
  if (name == "sharded") {
    f(ddp::update::sharded{});
  } else if (name == "sharded_gradients") {
    if constexpr (ddp::places_gradients<Model>) f(ddp::update::sharded_gradients{});
    else
      throw std::invalid_argument("--update sharded_gradients places the model's gradients layer by layer, which this "
                                  "platform's model does not offer (set_layer_hooks, place_gradient): use --update "
                                  "sharded");
  } else if (name == "fully_sharded") {
    if constexpr (ddp::places_parameters<Model>) f(ddp::update::fully_sharded{});
    else
      throw std::invalid_argument("--update fully_sharded places the model's parameters layer by layer, which this "
                                  "platform's model does not offer (place_parameter and the layer hooks): use --update "
                                  "sharded");
  } else {
    f(ddp::update::replicated{});
  }
}
template <class F>
void with_sampler(const std::string& name, F f) {
  using ddp::sampler::tail;
  if (name == "distributed") f(ddp::sampler::distributed<true, tail::pad>{});
  else if (name == "distributed_drop") f(ddp::sampler::distributed<true, tail::drop>{});
  else if (name == "distributed_in_order") f(ddp::sampler::distributed<false, tail::pad>{});
  else if (name == "contiguous") f(ddp::sampler::contiguous{});
}
// --reduction invariant: the exact sum over 8 virtual shards, which takes no communication hook
// (a hook would round before the sum) and, to keep the examples' builds short, the default sampler.
template <class F>
void with_reduction(const policy_flags& c, F f) {
  if (c.reduction != "invariant") return f(ddp::reduction::plain{}, hook_choice{}, buffer_sync_choice{});
  if (c.hook != "none")
    throw std::invalid_argument("--reduction invariant sums the gradients exactly as they are; --hook " + c.hook +
                                " would round them first: use --hook none");
  if (c.sampler != "distributed")
    throw std::invalid_argument("--reduction invariant deals each step as 8 virtual shards with the distributed "
                                "sampler; --sampler " + c.sampler + " is not offered with it");
  if (c.buffer_sync == "broadcast_each_forward" || c.buffer_sync == "average_once_per_step")
    throw std::invalid_argument("--reduction invariant: --buffer-sync " + c.buffer_sync + " is refused (a broadcast "
                                "per forward would pair one rank's broadcast with another's reduction; every rank's "
                                "buffers are already the same, and averaging them can change their last bit): "
                                "use broadcast_once_per_step or none");
  f(ddp::reduction::invariant<8>{}, ddp::comm_hook::none{}, invariant_buffer_sync_choice{});
}
template <class F>
void with_optimizer(const std::string& name, F f) {
  if (name == "sgd") f(ddp::optim::sgd{});
  else if (name == "adamw") f(ddp::optim::adamw{});
}

// Calls f(std::type_identity<T>{}) with the trainer type T the flags name, for a model, a
// communicator and a device. Every trainer type shares one trainer_core per communicator
// (docs/trainer.md), so each combination costs a thin layer, not a copy of the step: 32 of them,
// and two more for --sync under the replicated update and the plain reduction.
template <class Model, class Comm, class Device, class F>
void with_trainer_type(const policy_flags& c, F f) {
  if (c.update == "fully_sharded" && (c.sampler != "distributed" || c.reduction != "plain"))
    throw std::invalid_argument("--update fully_sharded: to keep the example's build short it is offered with the "
                                "default sampler and reduction (--sampler distributed --reduction plain)");
  if (c.sync != "every_step" && (c.update != "replicated" || c.reduction != "plain" || c.sampler != "distributed"))
    throw std::invalid_argument("--sync " + c.sync + ": each rank steps alone between syncs, which takes --update "
                                "replicated and --reduction plain; the example offers it with --sampler distributed");
  with_reduction(c, [&](auto reduction, auto hook, auto sync) {
    using reduction_t = decltype(reduction);
    with_update<Model>(c.update, [&](auto update) {
      // reduction::invariant and update::fully_sharded: the distributed sampler only.
      constexpr bool default_sampler =
          reduction_t::virtual_shards != 0 || ddp::update::shards_parameters<decltype(update)>();
      if constexpr (reduction_t::virtual_shards != 0 && ddp::update::shards_parameters<decltype(update)>()) return;
      with_sampler(default_sampler ? std::string("distributed") : c.sampler, [&](auto sampler) {
        using sampler_t = std::conditional_t<default_sampler, ddp::sampler::distributed<true, ddp::sampler::tail::pad>,
                                             decltype(sampler)>;
        with_optimizer(c.optimizer, [&](auto optimizer) {
          using update_t = std::remove_cvref_t<decltype(update)>;
          constexpr bool schedulable = reduction_t::virtual_shards == 0 && !ddp::update::gathers_parameters<update_t>() &&
                                       std::is_same_v<sampler_t, ddp::sampler::distributed<true, ddp::sampler::tail::pad>>;
          if constexpr (schedulable)
            if (c.sync != "every_step")
              return f(std::type_identity<ddp::trainer<
                           Model, std::remove_cvref_t<reduction_t>, std::remove_cvref_t<decltype(sync)>, update_t, unused_params_choice,
                           sampler_t, std::remove_cvref_t<decltype(optimizer)>, std::remove_cvref_t<decltype(hook)>,
                           sync_choice, ddp::bucket_cap<(1 << 20)>, ddp::use_communicator<Comm>,
                           ddp::use_device<Device>>>{});
          using trainer_t =
              ddp::trainer<Model, reduction_t, decltype(sync), decltype(update), unused_params_choice, sampler_t,
                           decltype(optimizer), decltype(hook), ddp::use_communicator<Comm>, ddp::use_device<Device>>;
          f(std::type_identity<trainer_t>{});
        });
      });
    });
  });
}

}  // namespace examples
