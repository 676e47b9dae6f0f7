#pragma once
#include <cstdint>
#include <string_view>

namespace ddp {

// avg divides the sum by the world size (integer division for integer types).
enum class reduce_op : std::uint8_t { sum, avg, min, max };

constexpr std::string_view name_of(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::avg: return "avg";
    case reduce_op::min: return "min";
    case reduce_op::max: return "max";
  }
  return "?";
}

}  // namespace ddp
