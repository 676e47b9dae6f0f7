#pragma once
// optim::external: the trainer reduces and leaves the update to an optimizer of the caller's own
// (a torch::optim optimizer over a ddp::torch module, say). After trainer.step() each parameter's
// gradient holds the average over ranks and micro-batches, and the trainer neither updates the
// parameters nor zeroes the gradients: the caller's optimizer steps, and zeroes them as it would
// without ddp.
//
//   ddp::trainer<decltype(model), ddp::optim::external> trainer(model, comm, dev);
//   torch::optim::Adam adam(net->parameters(), 1e-3);
//   trainer.step([&](auto& r) { r.backward(loss_of(r.forward(x))); });
//   adam.step();
//   adam.zero_grad();
//
// It needs update::replicated: under update::sharded a rank holds only its shard of the averaged
// gradient (the trainer says so at compile time).
#include <cstdint>
#include <string>
#include <string_view>

#include "ddp/core/host_device.hpp"
#include "ddp/optim/optimizer.hpp"

namespace ddp::optim {

struct external {
  using slot = optim::slot;
  static constexpr std::string_view name = "external";
  static constexpr int state_slots = 0;
  static constexpr bool applies_update = false;
  float lr = 0.0f;  // unused: the caller's optimizer has its own

  struct rule {
    DDP_HOST_DEVICE void operator()(float&, float, float*) const {}
  };
  rule at(std::int64_t) const { return {}; }
  std::string describe() const { return "external (the caller's optimizer steps)"; }
};

}  // namespace ddp::optim
