#pragma once
// Update: how the optimizer step is spread over the ranks.
//
//   replicated  (default) every rank all-reduces every gradient and updates every parameter, as
//               PyTorch's DistributedDataParallel does; each rank keeps the whole optimizer state.
//   sharded     each bucket is cut into N equal shards. Rank r receives shard r of the averaged
//               gradient (reduce_scatter), updates the parameters in that shard with that
//               shard's optimizer state, and the ranks all-gather the updated parameters (ZeRO
//               stage 1, PyTorch's ZeroRedundancyOptimizer). Every element goes through the same
//               arithmetic as under replicated, so the parameters are bitwise the same; each
//               rank runs 1/N of the optimizer, keeps 1/N of its state, and the two collectives
//               move the bytes of one all_reduce. A module that binds parameter storage
//               (`bind_parameter`) keeps its parameters in the gathered memory; otherwise the
//               trainer copies them in and out once per step.
//   sharded_gradients
//               sharded, and the rank keeps only its shard of the gradients (ZeRO stage 2): a
//               bucket's full gradients get memory when the first of its layers starts its
//               backward and give it back once their reduce_scatter completed; once a bucket
//               launched, the oldest beyond `gradient_buckets_in_flight` complete (on every rank
//               alike). The memory is taken from a pool of arrays of the largest bucket's size,
//               kept from step to step. The same collectives and arithmetic as sharded, so the
//               same bits. Needs a module that places gradients layer by layer (set_layer_hooks,
//               place_gradient and bind_gradient: ddp/concepts/module.hpp). Micro-batches before
//               the step's last keep their gradients whole until the step reduces them.
//   fully_sharded
//               sharded_gradients, and the rank keeps only its shard of the parameters too (ZeRO
//               stage 3, PyTorch's FullyShardedDataParallel): a bucket's parameters are gathered
//               (all_gather) when the first of its layers starts its forward, and again when the
//               first of them starts its backward, and their memory goes back once every layer
//               of the bucket is through; while a layer computes, the bucket the pass needs
//               next is already gathering. The optimizer updates this rank's shard where it is kept, and
//               no all_gather follows the update. The same arithmetic, so the same bits; the
//               bytes of one and a half all_reduce. Needs a module that places its parameters
//               layer by layer (place_parameter, and the layer hooks' before_forward,
//               after_forward and after_backward: ddp/concepts/module.hpp), with f32 parameters.
//               Between steps the module holds no parameter: trainer.gather_parameters() gathers
//               them all (collective) until the next step.
//
// A policy of this slot is a type with
//   using slot = ddp::update::slot;  static constexpr std::string_view name;
//   static constexpr ddp::update::memory_plan memory;  // which parameters and gradients a rank
//        // keeps, and when (below); the trainer builds the memory of every bucket from it
//   ddp::update::layout plan(std::size_t numel, int rank, int ranks) const;
//        // the part of a bucket of numel floats that `rank` updates
// The collectives follow from the memory plan, in bucket order on every rank: a rank that keeps
// every parameter whole all_reduces the gradients; one that gathers them reduce_scatters the
// gradients (its shard of the average) and, when it keeps a gathered copy, all_gathers the
// updated shards after the update; one that keeps only its shard gathers a bucket while its
// layers run.
#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "ddp/policy/slots.hpp"

namespace ddp::policy::update {

struct slot;

// The floats [begin, begin + shard) of a bucket are this rank's to update; the bucket's gradient
// (and gathered parameter) memory holds `padded` floats, at least the bucket's own.
struct layout {
  std::size_t shard = 0;
  std::size_t begin = 0;
  std::size_t padded = 0;
};

// Where a rank keeps a bucket's parameters.
enum class parameters_kept {
  whole,     // every parameter, where the module holds it; every rank updates all of them
  gathered,  // every parameter, in a copy per bucket that the ranks all_gather once each rank
             // updated its shard
  shard,     // only this rank's shard; a bucket is gathered while its layers run forward or
             // backward, and its memory goes back after
};
// Where a rank keeps a bucket's gradients.
enum class gradients_kept {
  whole,  // every gradient, the whole step
  shard,  // only this rank's reduced shard: a bucket's full gradients are held from the backward
          // of its first layer until its reduce_scatter completed
};

// An update policy's memory plan: which parameters and gradients a rank keeps, and when.
struct memory_plan {
  parameters_kept parameters = parameters_kept::whole;
  gradients_kept gradients = gradients_kept::whole;
  // gradients_kept::shard: at most this many buckets' full gradients reducing at once (on every
  // rank alike, the oldest completes when one more launches); 0 otherwise.
  std::size_t gradient_buckets_in_flight = 0;

  constexpr bool gathers_parameters() const noexcept { return parameters != parameters_kept::whole; }
  constexpr bool shards_parameters() const noexcept { return parameters == parameters_kept::shard; }
  constexpr bool shards_gradients() const noexcept { return gradients == gradients_kept::shard; }
  // The gradients' collective: this rank's shard of the average (reduce_scatter) when it updates
  // only its shard of the parameters, else the whole average (all_reduce).
  constexpr bool scatters_gradients() const noexcept { return gathers_parameters(); }
  // The updated shards go to every rank after the update (all_gather into the gathered copy).
  constexpr bool gathers_after_update() const noexcept { return parameters == parameters_kept::gathered; }
  // A rank can keep memory so: a bucket in flight at least when only the shard of the gradients is
  // kept (none otherwise); a rank that updates only its shard gathers the parameters; a rank that
  // keeps only its shard of the parameters keeps only its shard of the gradients.
  constexpr bool keepable() const noexcept {
    return (shards_gradients() == (gradient_buckets_in_flight > 0)) && (!shards_gradients() || gathers_parameters()) &&
           (!shards_parameters() || shards_gradients());
  }
  constexpr bool operator==(const memory_plan&) const = default;
};

template <class P>
concept policy = requires(const P& cp, std::size_t n, int r) {
  requires std::same_as<typename P::slot, slot>;
  { P::name } -> std::convertible_to<std::string_view>;
  { P::memory } -> std::convertible_to<memory_plan>;
  { cp.plan(n, r, r) } -> std::same_as<layout>;
};

struct replicated {
  using slot = update::slot;
  static constexpr std::string_view name = "replicated";
  static constexpr memory_plan memory{};
  layout plan(std::size_t numel, int, int) const { return {numel, 0, numel}; }
};

struct sharded {
  using slot = update::slot;
  static constexpr std::string_view name = "sharded";
  static constexpr memory_plan memory{.parameters = parameters_kept::gathered};
  static constexpr std::size_t alignment = 16;  // floats: every shard starts on a cache line
  layout plan(std::size_t numel, int rank, int ranks) const {
    const auto n = static_cast<std::size_t>(ranks);
    const std::size_t shard = (numel + n * alignment - 1) / (n * alignment) * alignment;
    return {shard, static_cast<std::size_t>(rank) * shard, shard * n};
  }
};

struct sharded_gradients : sharded {
  static constexpr std::string_view name = "sharded_gradients";
  static constexpr memory_plan memory{
      .parameters = parameters_kept::gathered, .gradients = gradients_kept::shard, .gradient_buckets_in_flight = 2};
};

// ZeRO stage 3: the parameters are gathered when a layer needs them, not after the update.
struct fully_sharded : sharded_gradients {
  static constexpr std::string_view name = "fully_sharded";
  static constexpr memory_plan memory{
      .parameters = parameters_kept::shard, .gradients = gradients_kept::shard, .gradient_buckets_in_flight = 2};
};

// The policy's memory plan; the default plan when it lacks the member, which its own message
// reports (so that the rules reading the plan add no second error).
template <class P>
consteval memory_plan memory_of() {
  if constexpr (requires { { P::memory } -> std::convertible_to<memory_plan>; }) return P::memory;
  else return {};
}
template <class P>
consteval bool gathers_parameters() { return memory_of<P>().gathers_parameters(); }
template <class P>
consteval bool shards_parameters() { return memory_of<P>().shards_parameters(); }
template <class P>
consteval std::size_t gradient_buckets_in_flight() { return memory_of<P>().gradient_buckets_in_flight; }

struct slot {
  static constexpr std::string_view name = "update";
  using default_policy = replicated;
};

template <class P>
consteval bool diagnose() {
  static_assert(requires { { P::name } -> std::convertible_to<std::string_view>; },
                "ddp: a policy in the update slot lacks `static constexpr std::string_view name`");
  static_assert(requires { { P::memory } -> std::convertible_to<memory_plan>; },
                "ddp: a policy in the update slot lacks `static constexpr ddp::update::memory_plan memory` (which "
                "parameters and gradients a rank keeps: ddp/policy/update.hpp); `memory{}` keeps them whole, as "
                "update::replicated");
  static_assert(requires(const P& p, std::size_t n, int r) { { p.plan(n, r, r) } -> std::same_as<layout>; },
                "ddp: a policy in the update slot lacks `ddp::update::layout plan(std::size_t numel, int rank, "
                "int ranks) const` (see ddp/policy/update.hpp)");
  constexpr memory_plan m = memory_of<P>();
  static_assert(!m.shards_gradients() || m.gradient_buckets_in_flight > 0,
                "ddp: a policy in the update slot keeps only its shard of the gradients (gradients_kept::shard) with "
                "gradient_buckets_in_flight 0 in its memory plan: allow at least one bucket in flight");
  static_assert(m.shards_gradients() || m.gradient_buckets_in_flight == 0,
                "ddp: a policy in the update slot keeps every gradient (gradients_kept::whole) but sets "
                "gradient_buckets_in_flight in its memory plan: leave it 0, or keep only the shard (gradients_kept::shard)");
  static_assert(!m.shards_gradients() || m.gathers_parameters(),
                "ddp: a policy in the update slot that keeps only its shard of the gradients (gradients_kept::shard) "
                "updates only its shard of the parameters, so it must gather them: parameters_kept::gathered in its "
                "memory plan, with an equal-shards plan, as update::sharded_gradients");
  static_assert(!m.shards_parameters() || m.shards_gradients(),
                "ddp: a policy in the update slot that keeps only its shard of the parameters (parameters_kept::shard) "
                "must keep only its shard of the gradients too: gradients_kept::shard in its memory plan, as "
                "update::fully_sharded");
  return policy<P> && m.keepable();
}

}  // namespace ddp::policy::update

// The slot's short spelling, as policy lists write it: ddp::update::... is ddp::policy::update::...
namespace ddp {
namespace update = policy::update;
}  // namespace ddp
