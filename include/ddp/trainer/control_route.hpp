#pragma once
// How the last bucket's control floats travel in a step (control_channel.hpp decides it, before
// the bucket's hook runs).

namespace ddp::detail {

enum class control_route {
  with_gradients,   // in the bucket's gradient all_reduce (the hook's reduce_gradients); after
                    // it, when the hook reduced the gradients otherwise
  after_gradients,  // in an all_reduce of their own, after the hook's collectives
  own_first,        // in the control channel's collective, ahead of the bucket's
  none,             // none go (a sync schedule's sync between steps has no control floats)
};

}  // namespace ddp::detail
