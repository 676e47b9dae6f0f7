#pragma once
// The optimizer slot: ddp::optim::sgd (default) or ddp::optim::adamw, listed among the
// trainer's policies; its hyper-parameters are the value passed to the trainer.
#include <string_view>

#include "ddp/optim/adamw.hpp"
#include "ddp/optim/sgd.hpp"

namespace ddp::optim {

struct slot {
  static constexpr std::string_view name = "optimizer";
  using default_policy = sgd;
};

}  // namespace ddp::optim
