#pragma once
// Mixed precision: the f32 master copies of the parameters a module keeps in bf16 or f16. The
// optimizer updates the master; the module's value is the master rounded to nearest even after
// each step. A 16-bit parameter's gradient is widened exactly into its f32 bucket (bucket.hpp).
// For a module of f32 parameters the set is empty: no memory, and its loops run over nothing.
#include <cstddef>
#include <utility>
#include <vector>

#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"
#include "ddp/core/buffer.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/trainer/parameter_table.hpp"

namespace ddp::detail {

template <device Device>
class master_weights {
 public:
  // Gives every 16-bit parameter of `params` an f32 master (its `value` from now on).
  master_weights(Device& dev, parameter_table& params) : device_(dev) {
    if (params.half_floats() == 0) return;
    masters_ = device_array<Device, float>(dev, params.half_floats());
    float* next = masters_.data();
    for (auto& p : params)
      if (p.type != dtype::f32) {
        p.value = std::exchange(next, next + p.numel);
        halves_.push_back({p.module_value, p.type, p.value, p.numel});
      }
  }

  // The masters take the module's values, exactly (a 16-bit value widens without rounding).
  void copy_from_module() {
    for (const auto& h : halves_)
      device_.cast(const_buffer{h.module_value, h.count, h.type}, mutable_buffer{h.master, h.count, dtype::f32});
  }
  // The f32 masters, in bytes.
  std::size_t bytes() const noexcept { return masters_.size() * sizeof(float); }

  // The module's 16-bit values: its master copies, rounded to nearest even.
  void round_into_module() {
    for (const auto& h : halves_)
      device_.cast(const_buffer{h.master, h.count, dtype::f32}, mutable_buffer{h.module_value, h.count, h.type});
  }

 private:
  struct half_parameter {
    void* module_value;
    dtype type;
    float* master;
    std::size_t count;
  };

  Device& device_;
  device_array<Device, float> masters_;
  std::vector<half_parameter> halves_;
};

}  // namespace ddp::detail
