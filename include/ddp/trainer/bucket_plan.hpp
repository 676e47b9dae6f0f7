#pragma once
// Which parameters share a gradient bucket: parameters in reverse order (the order backward
// usually finishes them), a new bucket whenever the next one would pass the byte cap. Each
// parameter starts at a multiple of 4 floats, so device kernels move it with 16-byte loads.
#include <cstddef>
#include <vector>

namespace ddp::detail {

inline constexpr std::size_t slot_alignment = 4;  // floats

struct bucket_slot {
  std::size_t bucket = 0;
  std::size_t offset = 0;  // in floats, inside the bucket
};

struct bucket_plan {
  std::vector<std::vector<std::size_t>> buckets;  // parameter indices, in bucket order
  std::vector<std::size_t> sizes;                 // floats per bucket
  std::vector<bucket_slot> slots;                 // per parameter
};

inline bucket_plan plan_buckets(const std::vector<std::size_t>& numels, std::size_t cap_bytes) {
  bucket_plan plan;
  plan.slots.resize(numels.size());
  const std::size_t cap = cap_bytes / sizeof(float);
  auto aligned = [](std::size_t n) { return (n + slot_alignment - 1) / slot_alignment * slot_alignment; };
  for (std::size_t k = numels.size(); k-- > 0;) {
    if (plan.buckets.empty() || (plan.sizes.back() > 0 && aligned(plan.sizes.back()) + numels[k] > cap)) {
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

}  // namespace ddp::detail
