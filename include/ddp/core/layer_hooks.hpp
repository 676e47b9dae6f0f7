#pragma once
// What a module that runs in layers tells a trainer around each layer's backward, so that the
// trainer can give a layer's gradients memory only while they are needed (update::
// sharded_gradients: from the layer's backward until the bucket's reduce_scatter completes).
// The module calls before_backward(first, count) before a layer's backward writes the gradients
// of parameters [first, first + count) (their positions in parameters()); the trainer places
// them (place_gradient) inside the call.
#include <cstddef>

namespace ddp {

class layer_hooks {
 public:
  virtual void before_backward(std::size_t first, std::size_t count) = 0;

 protected:
  ~layer_hooks() = default;
};

}  // namespace ddp
