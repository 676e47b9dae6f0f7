#pragma once
// Optimizer options for a group of parameters, selected by name (trainer.set_parameter_group):
// the common recipe excludes biases and normalisation weights from weight decay, and some
// layers train at a multiple of the learning rate.
//
//   trainer.set_parameter_group(ddp::optim::name_ends_with({".bias"}), {.weight_decay = 0.0f});
//   trainer.set_parameter_group([](std::string_view n) { return n.starts_with("0."); }, {.lr_scale = 0.1f});
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::optim {

struct parameter_group {
  float lr_scale = 1.0f;                  // multiplies the optimizer's lr (schedules included)
  std::optional<float> weight_decay = std::nullopt;  // replaces the optimizer's weight_decay
};

using parameter_selector = std::function<bool(std::string_view name)>;

// Parameters whose name ends with any of `suffixes` (".bias", ".running_mean", ...).
inline parameter_selector name_ends_with(std::initializer_list<std::string_view> suffixes) {
  std::vector<std::string> s(suffixes.begin(), suffixes.end());
  return [s](std::string_view name) {
    for (const auto& x : s)
      if (name.ends_with(x)) return true;
    return false;
  };
}

}  // namespace ddp::optim
