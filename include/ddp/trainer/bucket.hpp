#pragma once
// One gradient bucket: its memory, its layout (which part this rank updates, from the update
// policy), and the collectives the update policy issues on it (update::bucket_ops).
//
// Layout of grads (and of values, when the update policy gathers parameters): the parameters'
// slots in [0, numel), zero padding up to `padded`, then `control` floats (the unused-parameter
// policy's, last bucket only). This rank updates [shard_begin, shard_begin + shard).
#include <cstddef>
#include <optional>
#include <vector>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"
#include "ddp/core/segment.hpp"
#include "ddp/policy/update.hpp"

namespace ddp::detail {

template <communicator Comm, device Device>
struct bucket final : update::bucket_ops {
  using work_type = decltype(std::declval<Comm&>().all_reduce(const_buffer{}, mutable_buffer{}, reduce_op::avg));

  Comm* comm = nullptr;
  Device* device = nullptr;
  bool binds_values = false;  // the module keeps its parameters in `values`

  std::vector<std::size_t> params;
  std::vector<segment> segments;  // module grad <-> bucket grads
  std::size_t numel = 0;
  std::size_t shard = 0;
  std::size_t shard_begin = 0;
  std::size_t padded = 0;
  std::size_t control = 0;
  device_array<Device, float> grads;
  device_array<Device, float> state;   // optimizer state of the shard: state_slots * shard floats
  device_array<Device, float> values;  // gathered parameters, when the update policy gathers
  std::vector<segment> value_segments;  // module value <-> values
  std::size_t pending = 0;              // parameters still to report ready in this backward
  std::optional<work_type> work;          // the gradients' reduction
  std::optional<work_type> control_work;  // the control floats', when not part of `work`
  std::optional<work_type> gather;        // the updated parameters' all_gather

  void all_reduce_gradients() override {
    float* g = grads.data();
    work.emplace(comm->all_reduce(const_buffer{g, padded + control, dtype::f32},
                                  mutable_buffer{g, padded + control, dtype::f32}, reduce_op::avg));
  }
  void reduce_scatter_gradients() override {
    float* g = grads.data();
    work.emplace(comm->reduce_scatter(const_buffer{g, padded, dtype::f32},
                                      mutable_buffer{g + shard_begin, shard, dtype::f32}, reduce_op::avg));
    if (control)
      control_work.emplace(comm->all_reduce(const_buffer{g + padded, control, dtype::f32},
                                            mutable_buffer{g + padded, control, dtype::f32}, reduce_op::avg));
  }
  void all_gather_parameters() override {
    float* v = values.data();
    if (!binds_values) {  // this rank's shard of the module's parameters, copied in first
      std::vector<segment> mine;
      for (const auto& s : value_segments)
        if (const segment part = shard_part(s); part.count) mine.push_back(part);
      device->pack(mine, v + shard_begin);
    }
    gather.emplace(comm->all_gather(const_buffer{v + shard_begin, shard, dtype::f32},
                                    mutable_buffer{v, padded, dtype::f32}));
  }
  void finish_parameters() override {
    if (!gather) return;
    gather->wait();
    if (!binds_values) device->unpack(value_segments, values.data());
  }

  // Waits for every collective in flight, ignoring failures (a step that failed half-way).
  void drain() noexcept {
    for (auto* w : {&work, &control_work, &gather})
      if (*w) try {
          (*w)->wait();
        } catch (...) {
        }
  }

  // The part of a segment (offset in the bucket) inside this rank's shard: where its values start,
  // its offset from the shard's start, its count (0 when none of it is in the shard).
  segment shard_part(const segment& s) const {
    const std::size_t begin = std::max(s.offset, shard_begin);
    const std::size_t end = std::min(s.offset + s.count, shard_begin + shard);
    if (end <= begin) return {s.tensor, 0, 0};
    return {s.tensor + (begin - s.offset), begin - shard_begin, end - begin};
  }
};

}  // namespace ddp::detail
