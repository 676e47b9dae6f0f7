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
//   static constexpr bool gathers_parameters;  // the buckets keep a gathered copy of the
//                                              // parameters (all_gather_parameters needs it)
//   ddp::update::layout plan(std::size_t numel, int rank, int ranks) const;
//        // the part of a bucket of numel floats that `rank` updates
//   void reduce(ddp::update::bucket_ops&);        // the bucket's gradients are ready
//   void after_update(ddp::update::bucket_ops&);  // this rank updated its part of the bucket
//   void finish(ddp::update::bucket_ops&);        // every bucket is updated; before step() returns
// and, optionally,
//   static constexpr std::size_t gradient_buckets_in_flight;  // > 0: keep only this rank's shard
//        // of the gradients, at most this many buckets' full gradients reducing at once
//   static constexpr bool shards_parameters;  // keep only this rank's shard of the parameters,
//        // gathered layer by layer in forward and backward (needs gradient_buckets_in_flight > 0)
// Collectives are issued in bucket order on every rank; each operation of bucket_ops is one.
#include <concepts>
#include <cstddef>
#include <string_view>

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

// One bucket's collectives, offered by the trainer. Each starts asynchronously; the trainer
// waits for the gradients before the optimizer runs.
class bucket_ops {
 public:
  // The bucket's gradients (and control floats) averaged over the ranks, everywhere.
  virtual void all_reduce_gradients() = 0;
  // This rank's shard of the averaged gradients (the control floats averaged beside it).
  virtual void reduce_scatter_gradients() = 0;
  // Every rank's updated shard of the parameters to every rank.
  virtual void all_gather_parameters() = 0;
  // Waits for all_gather_parameters and leaves the parameters where the module reads them.
  virtual void finish_parameters() = 0;

 protected:
  ~bucket_ops() = default;
};

template <class P>
concept policy = requires(P& p, const P& cp, bucket_ops& b, std::size_t n, int r) {
  requires std::same_as<typename P::slot, slot>;
  { P::name } -> std::convertible_to<std::string_view>;
  { P::gathers_parameters } -> std::convertible_to<bool>;
  { cp.plan(n, r, r) } -> std::same_as<layout>;
  p.reduce(b);
  p.after_update(b);
  p.finish(b);
};

struct replicated {
  using slot = update::slot;
  static constexpr std::string_view name = "replicated";
  static constexpr bool gathers_parameters = false;
  layout plan(std::size_t numel, int, int) const { return {numel, 0, numel}; }
  void reduce(bucket_ops& b) { b.all_reduce_gradients(); }
  void after_update(bucket_ops&) {}
  void finish(bucket_ops&) {}
};

struct sharded {
  using slot = update::slot;
  static constexpr std::string_view name = "sharded";
  static constexpr bool gathers_parameters = true;
  static constexpr std::size_t alignment = 16;  // floats: every shard starts on a cache line
  layout plan(std::size_t numel, int rank, int ranks) const {
    const auto n = static_cast<std::size_t>(ranks);
    const std::size_t shard = (numel + n * alignment - 1) / (n * alignment) * alignment;
    return {shard, static_cast<std::size_t>(rank) * shard, shard * n};
  }
  void reduce(bucket_ops& b) { b.reduce_scatter_gradients(); }
  void after_update(bucket_ops& b) { b.all_gather_parameters(); }
  void finish(bucket_ops& b) { b.finish_parameters(); }
};

struct sharded_gradients : sharded {
  static constexpr std::string_view name = "sharded_gradients";
  static constexpr std::size_t gradient_buckets_in_flight = 2;
};

// ZeRO stage 3: the parameters are gathered when a layer needs them, not after the update.
struct fully_sharded : sharded_gradients {
  static constexpr std::string_view name = "fully_sharded";
  static constexpr bool shards_parameters = true;
  void after_update(bucket_ops&) {}
  void finish(bucket_ops&) {}
};

// 0 unless the policy keeps only its shard of the gradients.
template <class P>
consteval std::size_t gradient_buckets_in_flight() {
  if constexpr (requires { { P::gradient_buckets_in_flight } -> std::convertible_to<std::size_t>; })
    return P::gradient_buckets_in_flight;
  else return 0;
}

// Whether the policy keeps only its shard of the parameters.
template <class P>
consteval bool shards_parameters() {
  if constexpr (requires { { P::shards_parameters } -> std::convertible_to<bool>; })
    return P::shards_parameters;
  else return false;
}

// The policy's gathers_parameters; true when it lacks the member, which its own message reports.
template <class P>
consteval bool gathers_parameters_or_unknown() {
  if constexpr (requires { { P::gathers_parameters } -> std::convertible_to<bool>; }) return P::gathers_parameters;
  else return true;
}

struct slot {
  static constexpr std::string_view name = "update";
  using default_policy = replicated;
};

template <class P>
consteval bool diagnose() {
  static_assert(requires { { P::name } -> std::convertible_to<std::string_view>; },
                "ddp: a policy in the update slot lacks `static constexpr std::string_view name`");
  static_assert(requires { { P::gathers_parameters } -> std::convertible_to<bool>; },
                "ddp: a policy in the update slot lacks `static constexpr bool gathers_parameters`");
  static_assert(requires(const P& p, std::size_t n, int r) { { p.plan(n, r, r) } -> std::same_as<layout>; },
                "ddp: a policy in the update slot lacks `ddp::update::layout plan(std::size_t numel, int rank, "
                "int ranks) const` (see ddp/policy/update.hpp)");
  static_assert(requires(P& p, bucket_ops& b) {
                  p.reduce(b);
                  p.after_update(b);
                  p.finish(b);
                },
                "ddp: a policy in the update slot lacks one of `reduce`, `after_update`, `finish` "
                "(each taking ddp::update::bucket_ops&; see ddp/policy/update.hpp)");
  static_assert(gradient_buckets_in_flight<P>() == 0 || gathers_parameters_or_unknown<P>(),
                "ddp: a policy in the update slot that keeps only its shard of the gradients "
                "(gradient_buckets_in_flight) updates only its shard of the parameters, so it must gather them: "
                "`gathers_parameters = true` with an equal-shards plan, as update::sharded");
  static_assert(!shards_parameters<P>() || gradient_buckets_in_flight<P>() > 0,
                "ddp: a policy in the update slot that keeps only its shard of the parameters (shards_parameters) "
                "must keep only its shard of the gradients too: give it gradient_buckets_in_flight > 0, as "
                "update::fully_sharded");
  return policy<P>;
}

}  // namespace ddp::policy::update

// The slot's short spelling, as policy lists write it: ddp::update::... is ddp::policy::update::...
namespace ddp {
namespace update = policy::update;
}  // namespace ddp
