#pragma once
// Buckets: which parameters share a gradient reduction. Parameters go in reverse order (the
// order backward usually finishes them) into buckets of at most a byte cap; a parameter larger
// than the cap gets a bucket of its own. Smaller buckets start reducing earlier in backward;
// larger ones pay fewer per-collective latencies.
//
//   bucket_cap<Bytes>   every bucket holds at most Bytes (default 25 MiB, as PyTorch).
//
// A policy of this slot is a type with
//   using slot = ddp::buckets::slot;  static constexpr std::string_view name;
//   ddp::bucket_plan plan(std::span<const std::size_t> numels) const;  // floats per parameter
//   std::string describe() const;
// ddp::plan_buckets(numels, cap_of) builds the usual plan from a cap per bucket index, e.g.
// PyTorch's small first bucket (so the first reduction starts early):
//   struct small_first_bucket {
//     using slot = ddp::buckets::slot;
//     static constexpr std::string_view name = "small_first_bucket";
//     ddp::bucket_plan plan(std::span<const std::size_t> numels) const {
//       return ddp::plan_buckets(numels, [](std::size_t b) { return b == 0 ? 1u << 20 : 25u << 20; });
//     }
//     std::string describe() const { return "1 MiB, then 25 MiB"; }
//   };
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ddp/policy/slots.hpp"

namespace ddp::policy {

namespace buckets {
struct slot;
}

// Each parameter starts at a multiple of this many floats in its bucket, so device kernels move
// it with 16-byte loads.
inline constexpr std::size_t bucket_slot_alignment = 4;

struct bucket_slot {
  std::size_t bucket = 0;
  std::size_t offset = 0;  // in floats, inside the bucket
};

// Buckets are reduced in index order; each lists its parameters.
struct bucket_plan {
  std::vector<std::vector<std::size_t>> buckets;  // parameter indices, in bucket order
  std::vector<std::size_t> sizes;                 // floats per bucket
  std::vector<bucket_slot> slots;                 // per parameter
};

// Parameters last to first; a new bucket whenever the next parameter would take the current one
// past cap_of(bucket index) bytes.
template <class CapOf>
  requires std::is_invocable_r_v<std::size_t, CapOf&, std::size_t>
bucket_plan plan_buckets(std::span<const std::size_t> numels, CapOf cap_of) {
  bucket_plan plan;
  plan.slots.resize(numels.size());
  auto aligned = [](std::size_t n) {
    return (n + bucket_slot_alignment - 1) / bucket_slot_alignment * bucket_slot_alignment;
  };
  for (std::size_t k = numels.size(); k-- > 0;) {
    if (plan.buckets.empty() ||
        (plan.sizes.back() > 0 &&
         aligned(plan.sizes.back()) + numels[k] > cap_of(plan.buckets.size() - 1) / sizeof(float))) {
      plan.buckets.emplace_back();
      plan.sizes.push_back(0);
    }
    const std::size_t offset = aligned(plan.sizes.back());
    plan.slots[k] = {plan.buckets.size() - 1, offset};
    plan.buckets.back().push_back(k);
    plan.sizes.back() = offset + numels[k];
  }
  return plan;
}

template <std::size_t Bytes>
struct bucket_cap {
  static_assert(Bytes >= 4, "ddp: bucket_cap must hold at least one float (4 bytes)");
  using slot = buckets::slot;
  static constexpr std::string_view name = "bucket_cap";
  static constexpr std::size_t bytes = Bytes;
  bucket_plan plan(std::span<const std::size_t> numels) const {
    return plan_buckets(numels, [](std::size_t) { return Bytes; });
  }
  // "25 MiB", "256 KiB", "100 bytes": the largest unit that divides the cap.
  std::string describe() const {
    if (Bytes % (std::size_t{1} << 20) == 0) return std::to_string(Bytes >> 20) + " MiB";
    if (Bytes % (std::size_t{1} << 10) == 0) return std::to_string(Bytes >> 10) + " KiB";
    return std::to_string(Bytes) + " bytes";
  }
};

namespace buckets {
struct slot {
  static constexpr std::string_view name = "bucket_cap";
  using default_policy = bucket_cap<std::size_t{25} << 20>;  // 25 MiB, as PyTorch
};

template <class P>
concept policy = requires(const P& p, std::span<const std::size_t> numels) {
  requires std::same_as<typename P::slot, slot>;
  { P::name } -> std::convertible_to<std::string_view>;
  { p.plan(numels) } -> std::same_as<bucket_plan>;
  { p.describe() } -> std::convertible_to<std::string>;
};

template <class P>
consteval bool diagnose() {
  static_assert(requires { { P::name } -> std::convertible_to<std::string_view>; },
                "ddp: a policy in the bucket_cap slot lacks `static constexpr std::string_view name`");
  static_assert(requires(const P& p, std::span<const std::size_t> numels) {
                  { p.plan(numels) } -> std::same_as<bucket_plan>;
                },
                "ddp: a policy in the bucket_cap slot lacks `ddp::bucket_plan plan(std::span<const "
                "std::size_t> numels) const` (ddp::plan_buckets builds one; see ddp/policy/bucket_cap.hpp)");
  static_assert(requires(const P& p) { { p.describe() } -> std::convertible_to<std::string>; },
                "ddp: a policy in the bucket_cap slot lacks `std::string describe() const`");
  return policy<P>;
}
}  // namespace buckets

}  // namespace ddp::policy

// The short spellings policy lists and user plans write: ddp::bucket_cap<Bytes>, ddp::buckets::slot.
namespace ddp {
namespace buckets = policy::buckets;
using policy::bucket_cap;
using policy::bucket_plan;
using policy::bucket_slot;
using policy::bucket_slot_alignment;
using policy::plan_buckets;
}  // namespace ddp
