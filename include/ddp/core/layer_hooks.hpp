#pragma once
// What a module that runs in layers tells a trainer around each layer, so that the trainer can
// give a layer's gradients (update::sharded_gradients) and parameters (update::fully_sharded)
// memory only while they are needed. Each call names the parameters [first, first + count) of one
// layer (their positions in parameters()):
//
//   before_forward   the layer's forward is about to read them; the trainer places their values
//                    (place_parameter) inside the call
//   after_forward    the layer's forward is done with them
//   before_backward  the layer's backward is about to read them and write their gradients; the
//                    trainer places both inside the call
//   after_backward   the layer's backward is done with them
//
// A module that only places gradients may call before_backward alone; the others do nothing by
// default.
#include <cstddef>

namespace ddp {

class layer_hooks {
 public:
  virtual void before_forward(std::size_t /*first*/, std::size_t /*count*/) {}
  virtual void after_forward(std::size_t /*first*/, std::size_t /*count*/) {}
  virtual void before_backward(std::size_t first, std::size_t count) = 0;
  virtual void after_backward(std::size_t /*first*/, std::size_t /*count*/) {}

 protected:
  ~layer_hooks() = default;
};

}  // namespace ddp
