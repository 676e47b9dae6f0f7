#pragma once
#include <cstdint>
#include <string>

namespace ddp {

enum class device_kind : std::uint8_t { cpu, cuda };

// Where a tensor lives: the CPU, or one CUDA device by ordinal.
struct device_id {
  device_kind kind = device_kind::cpu;
  int index = 0;

  static constexpr device_id cpu() noexcept { return {device_kind::cpu, 0}; }
  static constexpr device_id cuda(int ordinal) noexcept { return {device_kind::cuda, ordinal}; }

  friend constexpr bool operator==(device_id, device_id) noexcept = default;

  std::string to_string() const {
    return kind == device_kind::cpu ? std::string("cpu") : "cuda:" + std::to_string(index);
  }
};

}  // namespace ddp
