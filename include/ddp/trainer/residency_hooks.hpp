#pragma once
// The module's layer hooks (ddp/core/layer_hooks.hpp) under an update policy that keeps only
// shards of the gradients, or of the parameters too: each call forwarded to the residency that
// holds and releases that memory.
#include <cstddef>
#include <vector>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/core/layer_hooks.hpp"
#include "ddp/trainer/gradient_residency.hpp"
#include "ddp/trainer/parameter_residency.hpp"

namespace ddp::detail {

template <communicator Comm, device Device>
class residency_hooks final : public layer_hooks {
 public:
  residency_hooks(const parameter_table& params, std::vector<bucket<Comm, Device>>& buckets,
                  gradient_residency<Comm, Device>& gradients, parameter_residency<Comm, Device>& parameters)
      : params_(params), buckets_(buckets), gradients_(gradients), parameters_(parameters) {}
  // Holds references and state that others point into: neither copied nor moved.
  residency_hooks(const residency_hooks&) = delete;
  residency_hooks& operator=(const residency_hooks&) = delete;

  void before_forward(std::size_t first, std::size_t count) override {
    if (parameters_.active()) parameters_.need(first, count, /*forward=*/true);
  }
  void after_forward(std::size_t first, std::size_t count) override {
    if (parameters_.active()) parameters_.done(first, count, /*forward=*/true);
  }
  // Backward is about to read parameters [first, first + count) and write their gradients.
  void before_backward(std::size_t first, std::size_t count) override {
    if (parameters_.active()) parameters_.need(first, count, /*forward=*/false);
    for (std::size_t i = first; i < first + count && i < params_.size(); ++i)
      if (params_[i].type == dtype::f32) gradients_.hold(buckets_[params_[i].slot.bucket], i);
  }
  void after_backward(std::size_t first, std::size_t count) override {
    if (parameters_.active()) parameters_.done(first, count, /*forward=*/false);
  }

 private:
  const parameter_table& params_;
  std::vector<bucket<Comm, Device>>& buckets_;
  gradient_residency<Comm, Device>& gradients_;
  parameter_residency<Comm, Device>& parameters_;
};

}  // namespace ddp::detail
