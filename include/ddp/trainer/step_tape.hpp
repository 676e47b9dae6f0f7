#pragma once
// The order of one step's forwards and backwards, checked as they come. Each backward pops the
// innermost pending forward; the step's last backward (the final micro-batch's outermost) sends
// its gradients as they become ready, so no forward may follow it; a micro-batch ends with every
// forward matched by its backward.
#include <cstddef>
#include <string>

#include "ddp/core/error.hpp"

namespace ddp::detail {

class step_tape {
 public:
  explicit step_tape(int rank) noexcept : rank_(rank) {}

  // A micro-batch begins; `final`: the step's last (its backward reduces and the update follows).
  void begin_micro_batch(bool final) {
    require_outside_micro_batch(final ? "step" : "accumulate");
    open_ = true;
    final_ = final;
    sent_ = false;
  }

  void begin_forward() {
    if (sent_)  // its backward would add to gradients already on their way
      fail("forward", "a forward after this step's last backward, whose gradients are already being reduced: "
                      "run every forward of a step before its backwards (innermost first), or give each "
                      "forward-backward pair its own accumulate() and end with step()");
    forward_index_ = forwards_++;
    ++depth_;
  }

  // Returns whether this is the step's last backward.
  bool begin_backward() {
    if (depth_ == 0)
      fail("backward", "backward without a pending forward in this step: call replica.forward before each "
                       "replica.backward");
    const bool last = depth_ == 1 && final_;
    sent_ = sent_ || last;
    in_last_backward_ = last;
    return last;
  }
  void end_backward() noexcept {
    in_last_backward_ = false;
    --depth_;
  }

  // Returns whether the micro-batch was the step's last.
  bool end_micro_batch() {
    open_ = false;
    if (depth_ != 0) {
      const auto n = depth_;
      depth_ = 0;
      fail("step", std::to_string(n) + " forward(s) in this step had no backward; call replica.backward once per "
                                       "forward, innermost first");
    }
    return final_;
  }

  void end_step() noexcept { forwards_ = forward_index_ = 0; }

  bool in_last_backward() const noexcept { return in_last_backward_; }
  // For what must not run from inside the function of a step() or accumulate().
  void require_outside_micro_batch(const char* operation) const {
    if (open_)
      fail(operation, "called inside the function of a step() or accumulate(), whose micro-batch has not ended; "
                      "each call runs its function as one whole micro-batch: call step(), accumulate() and "
                      "zero_gradients() one after another, never from inside those functions");
  }
  // The running forward's index since the last update, 0 between steps (the buffer-sync
  // policies' forward_index()).
  const std::size_t& forward_index() const noexcept { return forward_index_; }

 private:
  [[noreturn]] void fail(const char* operation, const std::string& what) const {
    throw error("trainer", operation, rank_, what);
  }

  int rank_;
  int depth_ = 0;  // forwards without their backward yet
  bool open_ = false;   // a micro-batch's function is running
  bool final_ = false;
  bool sent_ = false;  // the step's last backward has begun: buckets go out as they fill
  bool in_last_backward_ = false;
  std::size_t forwards_ = 0;  // since the last update
  std::size_t forward_index_ = 0;
};

}  // namespace ddp::detail
