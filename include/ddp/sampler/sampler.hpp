#pragma once
// Sampler policies: which dataset indices each rank visits in an epoch.
//
//   distributed<shuffle, tail>   the epoch's order (a permutation seeded by seed and epoch when
//                                shuffling) is dealt round-robin: rank r takes positions r,
//                                r + world, ... as PyTorch's DistributedSampler. tail::pad
//                                repeats from the start so every rank gets ceil(n / world)
//                                indices and every sample is visited; tail::drop cuts the order
//                                to floor(n / world) per rank, so no sample is seen twice.
//   contiguous                   rank r takes the r-th of `world` equal slices, in order; the
//                                remainder is dropped. For data whose locality matters.
//
// The trainer owns the epoch counter and passes it in (pitfall P4): the order changes every
// epoch, and is identical on every run with the same seed.
//
// A policy of this slot is a type with
//   using slot = ddp::sampler::slot;  static constexpr std::string_view name;
//   static constexpr bool is_distributed;   // orders the data per epoch (no loader shuffle beside it)
//   std::size_t per_rank(std::size_t n, int world) const;   // indices each rank gets
//   std::vector<std::size_t> indices(std::size_t n, int rank, int world,
//                                    std::uint64_t seed, std::uint64_t epoch) const;
// and, when it pads (repeats samples so every rank gets as many), also
//   std::size_t real_count(std::size_t n, int rank, int world) const;
//        // how many of the rank's indices are samples; the rest, at the end of its list, padding
//   static constexpr bool visits_every_sample = true;   // loaders keep a last partial batch
// and, to continue an epoch at another world size (a checkpoint saved in the middle of one, a
// membership that lost a rank: docs/elastic.md), also
//   std::vector<std::size_t> remaining_indices(std::size_t n, std::size_t taken, int rank, int world,
//                                              std::uint64_t seed, std::uint64_t epoch) const;
//        // the epoch's order after the `taken` positions that ranks of any world size took first
//        // (a prefix of it, as round-robin dealing takes), dealt to `world` ranks
// The functions may be static, or members of a sampler that carries state (a stratified
// sampler's labels, a weighted one's weights): the trainer keeps the sampler as a value
// (trainer.policy<ddp::sampler::slot>()), and calls it through that object.
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <range/v3/range/conversion.hpp>
#include <range/v3/view/cycle.hpp>
#include <range/v3/view/drop.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/stride.hpp>
#include <range/v3/view/take.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/random.hpp"
#include "ddp/core/shard.hpp"
#include "ddp/policy/slots.hpp"

namespace ddp::sampler {

enum class tail { pad, drop };

struct slot;

// Throws unless 0 <= rank < world: an out-of-range rank would get another rank's indices, or
// none, and a world of 0 divides by zero.
inline void check_placement(const char* sampler, int rank, int world) {
  if (world < 1)
    throw error("sampler", sampler, rank,
                "the world size is " + std::to_string(world) + "; it must be at least 1 (pass comm.size())");
  if (rank < 0 || rank >= world)
    throw error("sampler", sampler, rank,
                "rank " + std::to_string(rank) + " is outside a world of size " + std::to_string(world) +
                    " (pass comm.rank(), 0 to " + std::to_string(world - 1) + ")");
}

// The permutation of 0..n-1 for (seed, epoch): Fisher-Yates with an unbiased bounded draw.
inline std::vector<std::size_t> permutation(std::size_t n, std::uint64_t seed, std::uint64_t epoch) {
  auto order = ranges::views::iota(std::size_t{0}, n) | ranges::to<std::vector>();
  splitmix64 rng(seed * 0x2545f4914f6cdd1dull + epoch);
  for (std::size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  return order;
}

template <bool Shuffle = true, tail Tail = tail::pad>
struct distributed {
  using slot = sampler::slot;
  static constexpr bool shuffle = Shuffle;
  static constexpr bool is_distributed = true;
  static constexpr sampler::tail tail_mode = Tail;
  static constexpr std::string_view name = Shuffle ? (Tail == tail::pad ? "distributed(shuffle, pad)"
                                                                        : "distributed(shuffle, drop)")
                                                   : (Tail == tail::pad ? "distributed(in order, pad)"
                                                                        : "distributed(in order, drop)");

  static std::size_t per_rank(std::size_t n, int world) {
    check_placement("distributed", 0, world);
    const auto w = static_cast<std::size_t>(world);
    return Tail == tail::pad ? (n + w - 1) / w : n / w;
  }

  static constexpr bool visits_every_sample = Tail == tail::pad;

  // Position p of the epoch's order goes to rank p mod world; positions from n on are repeats.
  static std::size_t real_count(std::size_t n, int rank, int world) {
    check_placement("distributed", rank, world);
    const auto r = static_cast<std::size_t>(rank), w = static_cast<std::size_t>(world);
    return std::min(per_rank(n, world), n > r ? (n - r + w - 1) / w : 0);
  }

  static std::vector<std::size_t> indices(std::size_t n, int rank, int world, std::uint64_t seed,
                                          std::uint64_t epoch) {
    return remaining_indices(n, 0, rank, world, seed, epoch);
  }

  // Whatever the world size, the ranks' first k batches of B take the order's first world * k * B
  // positions: the rest of the epoch is the order after them, dealt to the new world as a whole
  // order is.
  static std::vector<std::size_t> remaining_indices(std::size_t n, std::size_t taken, int rank, int world,
                                                    std::uint64_t seed, std::uint64_t epoch) {
    check_placement("distributed", rank, world);
    taken = std::min(taken, n);
    if (taken == n) return {};
    auto order = Shuffle ? permutation(n, seed, epoch)
                         : ranges::views::iota(std::size_t{0}, n) | ranges::to<std::vector>();
    const std::size_t total = per_rank(n - taken, world) * static_cast<std::size_t>(world);
    return order | ranges::views::drop(taken) | ranges::views::cycle | ranges::views::take(total) |
           ranges::views::drop(static_cast<std::size_t>(rank)) |
           ranges::views::stride(static_cast<std::ptrdiff_t>(world)) | ranges::to<std::vector>();
  }
};

struct contiguous {
  using slot = sampler::slot;
  static constexpr bool shuffle = false;
  static constexpr bool is_distributed = false;
  static constexpr std::string_view name = "contiguous";

  static std::size_t per_rank(std::size_t n, int world) {
    check_placement("contiguous", 0, world);
    return n / static_cast<std::size_t>(world);
  }

  static std::vector<std::size_t> indices(std::size_t n, int rank, int world, std::uint64_t,
                                          std::uint64_t) {
    check_placement("contiguous", rank, world);
    const std::size_t m = per_rank(n, world), begin = m * static_cast<std::size_t>(rank);
    return ranges::views::iota(begin, begin + m) | ranges::to<std::vector>();
  }
};

struct slot {
  static constexpr std::string_view name = "sampler";
  using default_policy = distributed<true, tail::pad>;
};

template <class P>
concept policy = requires(const P& p, std::size_t n, int r, std::uint64_t u) {
  requires std::same_as<typename P::slot, slot>;
  { P::name } -> std::convertible_to<std::string_view>;
  { P::is_distributed } -> std::convertible_to<bool>;
  { p.per_rank(n, r) } -> std::convertible_to<std::size_t>;
  { p.indices(n, r, r, u, u) } -> std::convertible_to<std::vector<std::size_t>>;
};

template <policy P>
constexpr bool visits_every_sample() {
  if constexpr (requires { { P::visits_every_sample } -> std::convertible_to<bool>; }) return P::visits_every_sample;
  else return false;
}

template <policy P>
std::size_t real_count(const P& p, std::size_t n, int rank, int world) {
  if constexpr (requires { { p.real_count(n, rank, world) } -> std::convertible_to<std::size_t>; })
    return p.real_count(n, rank, world);
  else return p.per_rank(n, world);
}
template <policy P>
std::size_t real_count(std::size_t n, int rank, int world) {
  return real_count(P{}, n, rank, world);
}

// This rank's share of an epoch, as sampler `p` deals it.
template <policy P>
ddp::shard make_shard(const P& p, std::size_t n, int rank, int world, std::uint64_t seed, std::uint64_t epoch) {
  ddp::shard s{p.indices(n, rank, world, seed, epoch), {}, rank, visits_every_sample<P>()};
  for (int r = 0; r < world; ++r) s.real_counts.push_back(real_count(p, n, r, world));
  if (s.real_count() > s.indices.size())
    throw error("sampler", std::string(P::name), rank,
                "real_count() is " + std::to_string(s.real_count()) + " but indices() gave " +
                    std::to_string(s.indices.size()) + " indices; real_count must not exceed them");
  return s;
}
template <policy P>
ddp::shard make_shard(std::size_t n, int rank, int world, std::uint64_t seed, std::uint64_t epoch) {
  return make_shard(P{}, n, rank, world, seed, epoch);
}

// Whether sampler `P` can continue an epoch at another world size (remaining_indices).
template <class P>
concept recuts_epochs = requires(const P& p, std::size_t n, int r, std::uint64_t u) {
  { p.remaining_indices(n, n, r, r, u, u) } -> std::convertible_to<std::vector<std::size_t>>;
};

// This rank's share of the rest of an epoch after its order's first `taken` positions.
template <recuts_epochs P>
ddp::shard remaining_shard(const P& p, std::size_t n, std::size_t taken, int rank, int world, std::uint64_t seed,
                           std::uint64_t epoch) {
  const std::size_t rest = n - std::min(n, taken);
  ddp::shard s{p.remaining_indices(n, taken, rank, world, seed, epoch), {}, rank, visits_every_sample<P>()};
  for (int r = 0; r < world; ++r) s.real_counts.push_back(real_count(p, rest, r, world));
  return s;
}

// A whole data set in order, every sample counted once at any world size: rank r's share as
// distributed<false, tail::pad> deals it, the padding weighing nothing (trainer.evaluate()).
inline ddp::shard evaluation_shard(std::size_t n, int rank, int world) {
  return make_shard<distributed<false, tail::pad>>(n, rank, world, 0, 0);
}

// Batches of `batch` per rank in one epoch: equal on every rank; a short last one counts when
// the sampler visits every sample.
template <policy P>
std::size_t batches_per_epoch(const P& p, std::size_t n, int world, std::size_t batch) {
  const std::size_t m = p.per_rank(n, world);
  return visits_every_sample<P>() ? (m + batch - 1) / batch : m / batch;
}
template <policy P>
std::size_t batches_per_epoch(std::size_t n, int world, std::size_t batch) {
  return batches_per_epoch(P{}, n, world, batch);
}

template <class P>
consteval bool diagnose() {
  static_assert(requires { { P::name } -> std::convertible_to<std::string_view>; },
                "ddp: a policy in the sampler slot lacks `static constexpr std::string_view name`");
  static_assert(requires { { P::is_distributed } -> std::convertible_to<bool>; },
                "ddp: a policy in the sampler slot lacks `static constexpr bool is_distributed`");
  static_assert(requires(const P& p, std::size_t n, int w) { { p.per_rank(n, w) } -> std::convertible_to<std::size_t>; },
                "ddp: a policy in the sampler slot lacks `std::size_t per_rank(std::size_t n, int world) const` "
                "(or a static one)");
  static_assert(requires(const P& p, std::size_t n, int r, std::uint64_t u) {
                  { p.indices(n, r, r, u, u) } -> std::convertible_to<std::vector<std::size_t>>;
                },
                "ddp: a policy in the sampler slot lacks `std::vector<std::size_t> indices(std::size_t n, "
                "int rank, int world, std::uint64_t seed, std::uint64_t epoch) const` (or a static one)");
  return policy<P>;
}

}  // namespace ddp::sampler
