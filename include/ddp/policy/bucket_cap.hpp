#pragma once
// Gradient bucket size cap in bytes. Parameters are packed in reverse order into buckets of at
// most this many bytes (a parameter larger than the cap gets a bucket of its own). Smaller
// buckets start reducing earlier in backward; larger ones pay fewer per-collective latencies.
#include <cstddef>
#include <string_view>

#include "ddp/policy/slots.hpp"

namespace ddp {

namespace bucket_cap_detail {
struct slot;
}

template <std::size_t Bytes>
struct bucket_cap {
  static_assert(Bytes >= 4, "ddp: bucket_cap must hold at least one float (4 bytes)");
  using slot = bucket_cap_detail::slot;
  static constexpr std::string_view name = "bucket_cap";
  static constexpr std::size_t bytes = Bytes;
};

namespace bucket_cap_detail {
struct slot {
  static constexpr std::string_view name = "bucket_cap";
  using default_policy = bucket_cap<std::size_t{25} << 20>;  // 25 MiB, as PyTorch
};
}  // namespace bucket_cap_detail

}  // namespace ddp
