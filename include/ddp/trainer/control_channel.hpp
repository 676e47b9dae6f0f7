#pragma once
// The control floats of a step: this rank's micro-batch count, then the unused-parameter policy's
// floats, averaged over the ranks so that every rank reads the same and decides alike. How they
// travel is decided here, before the last bucket's hook runs (control_route): offered to the
// last bucket's gradient all_reduce when the gradients are all-reduced in f32 (one collective,
// when the hook calls bucket_io::reduce_gradients, as a plain hook must; a hook that reduces them
// otherwise leaves them to an all_reduce of their own after its collectives), else after the
// bucket's collectives; and when the update overlaps the reductions and there are buckets to
// update while the last reduces, in a collective of their own issued just before the last
// bucket's gradients, so that the step's verdict is known while that bucket still reduces.
#include <cmath>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"
#include "ddp/concepts/work.hpp"
#include "ddp/core/buffer.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/reduce_op.hpp"
#include "ddp/trainer/control_route.hpp"

namespace ddp::detail {

template <communicator Comm, device Device>
class control_channel {
 public:
  using work_type = decltype(std::declval<Comm&>().all_reduce(const_buffer{}, mutable_buffer{}, reduce_op::avg));

  control_channel(Comm& comm, Device& dev) : comm_(comm), device_(dev) {}
  // Holds references and state that others point into: neither copied nor moved.
  control_channel(const control_channel&) = delete;
  control_channel& operator=(const control_channel&) = delete;

  // How the control floats go: on their own first when the update overlaps the reductions and
  // there are buckets before the last to update while it reduces (and there are floats to send:
  // a captured step sends none); with the gradients when they are all-reduced in f32
  // (`f32_all_reduce`: no reduce_scatter, no exact sum); else after them.
  static control_route route(bool sends, bool overlaps_update, std::size_t buckets, bool f32_all_reduce) noexcept {
    if (sends && overlaps_update && buckets > 1) return control_route::own_first;
    return f32_all_reduce ? control_route::with_gradients : control_route::after_gradients;
  }

  // The control floats averaged in a collective of their own, ahead of the last bucket's.
  void send(std::span<const float> control) {
    const comm::tag_scope tag(comm::purpose::control);
    if (floats_.size() != control.size()) floats_ = device_array<Device, float>(device_, control.size());
    device_.copy_from_host(floats_.data(), control.data(), control.size_bytes());
    work_.emplace(comm_.all_reduce(const_buffer{floats_.data(), control.size(), dtype::f32},
                                   mutable_buffer{floats_.data(), control.size(), dtype::f32}, reduce_op::avg));
  }
  // They went on their own in this step.
  bool sent() const noexcept { return work_.has_value(); }
  // The averaged floats (after send()).
  void read(std::span<float> out) {
    work_->wait();
    device_.copy_to_host(out.data(), floats_.data(), out.size_bytes());
    rethrow_failure(*work_);
  }
  // Waits for the collective still in flight, ignoring failures (a step that failed half-way).
  void drain() noexcept {
    if (work_) try {
        work_->wait();
      } catch (...) {
      }
  }
  void end_step() noexcept { work_.reset(); }

  // The verdict's mean micro-batch count from the averaged one. Under an exact sum over
  // `virtual_shards` the gradients already are the average over the step's micro-batches: the
  // mean is 1 (or 0), after checking that the ranks ran as many in all.
  float mean_micro_batches(float mean_micro_batches, std::size_t virtual_shards) const {
    if (!virtual_shards || mean_micro_batches == 0.0f) return mean_micro_batches;
    const auto total = static_cast<std::size_t>(std::lround(mean_micro_batches * static_cast<float>(comm_.size())));
    if (total != virtual_shards)
      throw collective_error("trainer", "step", comm_.rank(),
                             "under reduction::invariant<" + std::to_string(virtual_shards) + "> a step is " +
                                 std::to_string(virtual_shards) + " micro-batches over all ranks (one per virtual "
                                 "shard), but the ranks ran " + std::to_string(total) + " in this one: deal the "
                                 "shards with ddp::sampler::virtual_shards and run each once, with accumulate() and "
                                 "a last step()");
    return 1.0f;
  }

 private:
  Comm& comm_;
  Device& device_;
  device_array<Device, float> floats_;
  std::optional<work_type> work_;
};

}  // namespace ddp::detail
