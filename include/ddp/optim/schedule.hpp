#pragma once
// Learning-rate schedules: small objects, each a multiplier of the base learning rate at a step
// (0-based), that compose. Set the rate before each step:
//
//   const auto schedule = ddp::optim::schedule::linear_warmup(500, ddp::optim::schedule::cosine(total_steps));
//   trainer.learning_rate() = base_lr * schedule(step);
//
//   constant()                  1
//   cosine(total, floor = 0)    from 1 down to `floor` along half a cosine over `total` steps
//   step_decay(every, gamma)    gamma^(step / every): gamma times smaller every `every` steps
//   linear_warmup(steps, then)  then(step), ramped up linearly over the first `steps` steps
//                               ((step + 1) / steps of it)
//   any callable float(std::size_t) is a schedule too (a lambda of your own), and composes.
#include <cmath>
#include <concepts>
#include <cstddef>
#include <numbers>
#include <stdexcept>
#include <string>
#include <utility>

namespace ddp::optim::schedule {

template <class S>
concept schedule = std::copy_constructible<S> && requires(const S& s, std::size_t step) {
  { s(step) } -> std::convertible_to<float>;
};

struct constant {
  float operator()(std::size_t) const noexcept { return 1.0f; }
};

class cosine {
 public:
  explicit cosine(std::size_t total, float floor = 0.0f) : total_(total), floor_(floor) {
    if (total == 0) throw std::invalid_argument("ddp::optim::schedule::cosine: total steps must be at least 1");
  }
  float operator()(std::size_t step) const noexcept {
    const float half_wave = 0.5f * (1.0f + std::cos(std::numbers::pi_v<float> * static_cast<float>(step) /
                                                    static_cast<float>(total_)));
    return floor_ == 0.0f ? half_wave : floor_ + (1.0f - floor_) * half_wave;
  }

 private:
  std::size_t total_;
  float floor_;
};

class step_decay {
 public:
  step_decay(std::size_t every, float gamma) : every_(every), gamma_(gamma) {
    if (every == 0) throw std::invalid_argument("ddp::optim::schedule::step_decay: `every` must be at least 1 step");
  }
  float operator()(std::size_t step) const noexcept {
    return std::pow(gamma_, static_cast<float>(step / every_));
  }

 private:
  std::size_t every_;
  float gamma_;
};

template <schedule Then>
class linear_warmup {
 public:
  linear_warmup(std::size_t steps, Then then) : steps_(steps), then_(std::move(then)) {}
  float operator()(std::size_t step) const {
    const float ramp = step < steps_ ? static_cast<float>(step + 1) / static_cast<float>(steps_) : 1.0f;
    return ramp * static_cast<float>(then_(step));
  }

 private:
  std::size_t steps_;
  Then then_;
};

}  // namespace ddp::optim::schedule
