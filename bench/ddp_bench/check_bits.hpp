#pragma once
// ddp-bench collective --check bits: the same seeded inputs reduced over a backend at one world
// size, and the hash of the result. The inputs are V virtual shards of `count` floats (--shards,
// --seed), dealt over the ranks as ddp::sampler::virtual_shards deals a step's micro-batches;
// the result is their average, reduced as the trainer reduces gradients:
//   invariant  reduction::invariant<V>'s exact sum (the trainer's own, ddp::detail::exact_sum):
//              per block a scale agreed over the ranks, integers summed exactly; the same bits at
//              every world size and over every backend;
//   plain      each rank adds its shards in floating point and the communicator sums the ranks'
//              parts: the bits depend on how the shards are spread and on the backend's order.
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "collective_sweep.hpp"
#include "ddp/comm/collectives.hpp"
#include "ddp/concepts/device_array.hpp"
#include "ddp/core/random.hpp"
#include "ddp/sampler/virtual_shards.hpp"
#include "ddp/trainer/exact_sum.hpp"

namespace bench {

// One result of --check bits: a backend at a world size.
struct bits_row {
  std::string backend;
  int ranks = 0;
  std::uint64_t hash = 0;
  bool ranks_agree = true;  // every rank held the same bits
};

// Shard s's inputs: `count` floats drawn from the seed and s alone, of magnitudes 2^-8 to 2^8
// (so that a floating-point sum's bits depend on the order of its terms).
inline std::vector<float> seeded_shard(std::uint64_t seed, std::size_t s, std::size_t count) {
  ddp::splitmix64 g(seed ^ (0x9e3779b97f4a7c15ull * (s + 1)));
  std::vector<float> v(count);
  for (auto& x : v) x = std::ldexp(g.uniform(-1.0f, 1.0f), static_cast<int>(g.below(17)) - 8);
  return v;
}

inline std::uint64_t fnv1a(std::span<const float> v) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const auto byte : std::as_bytes(v)) h = (h ^ static_cast<unsigned char>(byte)) * 0x100000001b3ull;
  return h;
}

// Every rank of `comm` calls it; `host` is a host-memory communicator over the same ranks (it
// may be `comm`), `dev` the rank's device. Returns the hash of this rank's result and whether
// every rank's is the same.
template <class Comm, class Host, class Device>
bits_row reduce_seeded(Comm& comm, Host& host, Device& dev, const collective_params& p, std::size_t count) {
  const auto mine = ddp::sampler::virtual_shards(p.shards, comm.rank(), comm.size());
  const std::size_t bytes = count * sizeof(float);
  ddp::device_array<Device, float> result(dev, count);
  std::vector<float> average(count);
  if (p.reduction == "invariant") {
    ddp::detail::exact_sum<Comm, Device> sum(comm, dev, count, p.shards);
    for (std::size_t s = mine.first; s + 1 < mine.last; ++s) {
      const auto x = seeded_shard(p.seed, s, count);
      dev.copy_from_host(sum.set_aside_next(0), x.data(), bytes);
      sum.set_aside_done();
    }
    const auto last = seeded_shard(p.seed, mine.last - 1, count);
    ddp::device_array<Device, float> last_here(dev, count);
    dev.copy_from_host(last_here.data(), last.data(), bytes);
    const ddp::mutable_buffer integers = sum.start(last_here.data());
    ddp::comm::all_reduce(comm, integers, integers, ddp::reduce_op::sum);
    dev.synchronize();
    sum.finish(result.data(), 0, count);
    dev.copy_to_host(average.data(), result.data(), bytes);
  } else if (p.reduction == "plain") {
    std::vector<float> local(count, 0.0f);
    for (std::size_t s = mine.first; s < mine.last; ++s) {
      const auto x = seeded_shard(p.seed, s, count);
      for (std::size_t i = 0; i < count; ++i) local[i] += x[i];
    }
    dev.copy_from_host(result.data(), local.data(), bytes);
    const ddp::mutable_buffer all{result.data(), count, ddp::dtype::f32};
    ddp::comm::all_reduce(comm, all, all, ddp::reduce_op::sum);
    dev.synchronize();
    dev.copy_to_host(average.data(), result.data(), bytes);
    for (auto& x : average) x /= static_cast<float>(p.shards);
  } else {
    throw std::invalid_argument("no reduction '" + p.reduction + "' for --check bits; choose invariant or plain");
  }
  bits_row row{"", comm.size(), fnv1a(average), true};
  std::int64_t low = std::bit_cast<std::int64_t>(row.hash), high = low;
  ddp::comm::all_reduce(host, std::span<std::int64_t>(&low, 1), ddp::reduce_op::min);
  ddp::comm::all_reduce(host, std::span<std::int64_t>(&high, 1), ddp::reduce_op::max);
  row.ranks_agree = low == high;
  return row;
}

}  // namespace bench
