#pragma once
// One gradient bucket: its memory, its layout (which part this rank updates, from the update
// policy), and the collectives the update policy issues on it (update::bucket_ops). A
// communication hook (ddp/policy/comm_hook.hpp) carries the gradients' reduction; it sees the
// bucket through comm_hook::bucket_io.
//
// Layout of grads (and of values, when the update policy gathers parameters): the parameters'
// slots in [0, numel), zero padding up to `padded`, then `control` floats (the unused-parameter
// policy's, last bucket only). This rank updates [shard_begin, shard_begin + shard).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/segment.hpp"
#include "ddp/policy/comm_hook.hpp"
#include "ddp/policy/update.hpp"
#include "ddp/trainer/parts.hpp"

namespace ddp::detail {

// A 16-bit tensor's place in a bucket of floats (a bf16 or f16 parameter's gradient).
struct half_segment {
  void* tensor = nullptr;
  dtype type = dtype::bf16;
  std::size_t offset = 0;
  std::size_t count = 0;
};

template <communicator Comm, device Device>
struct bucket final : update::bucket_ops {
  using work_type = decltype(std::declval<Comm&>().all_reduce(const_buffer{}, mutable_buffer{}, reduce_op::avg));

  Comm* comm = nullptr;
  Device* device = nullptr;
  comm_hook_part<Device>* hook = nullptr;
  const std::uint64_t* steps = nullptr;  // the trainer's step count
  std::size_t index = 0;
  bool binds_values = false;  // the module keeps its parameters in `values`

  std::vector<std::size_t> params;
  std::vector<segment> segments;  // module grad <-> bucket grads, f32 parameters
  std::vector<half_segment> half_grads;  // 16-bit parameters' gradients, widened into the bucket
  std::vector<comm_hook::tensor_layout> tensors;  // each parameter's place and matrix shape
  std::size_t numel = 0;
  std::size_t shard = 0;
  std::size_t shard_begin = 0;
  std::size_t padded = 0;
  std::size_t control = 0;
  device_array<Device, float> grads;
  device_array<Device, float> state;   // optimizer state of the shard: state_slots * shard floats
  device_array<Device, float> values;  // gathered parameters, when the update policy gathers
  std::vector<segment> value_segments;  // module value <-> values
  std::vector<device_array<Device, float>> hook_scratch;  // the hook's (before the works: freed after them)
  std::vector<device_array<Device, float>> hook_state;    // the hook's, saved in checkpoints
  std::size_t pending = 0;              // parameters still to report ready in this backward
  std::optional<work_type> work;          // the gradients' reduction (the hook's first collective)
  std::vector<work_type> more;            // the hook's further collectives in this step
  std::optional<work_type> control_work;  // the control floats', when not part of `work`
  std::optional<work_type> gather;        // the updated parameters' all_gather

  void all_reduce_gradients() override { start_reduction(false); }
  void reduce_scatter_gradients() override { start_reduction(true); }

  // Waits for the reduction and lets the hook complete it: the averaged gradients are in place.
  void complete_reduction() {
    hook_view io(*this);
    io.wait();
    if (control_work) control_work->wait();
    hook->finish(io);
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

  // Waits for every collective in flight, ignoring failures (a step that failed half-way). A
  // stream backend's wait() only orders the compute stream: the device's deallocate then waits
  // for the GPU before the memory goes.
  void drain() noexcept {
    auto quietly = [](work_type& w) {
      try {
        w.wait();
      } catch (...) {
      }
    };
    for (auto* w : {&work, &control_work, &gather})
      if (*w) quietly(**w);
    for (auto& w : more) quietly(w);
  }

  // A stream backend's failure that aborted this bucket's collectives (ddp::rethrow_failure):
  // after the host has synchronised with the device.
  void rethrow_failures() const {
    for (const auto* w : {&work, &control_work, &gather})
      if (*w) rethrow_failure(**w);
    for (const auto& w : more) rethrow_failure(w);
  }

  void clear_works() {
    work.reset(), more.clear(), control_work.reset(), gather.reset();
  }

  // The part of a segment (offset in the bucket) inside this rank's shard: where its values start,
  // its offset from the shard's start, its count (0 when none of it is in the shard).
  segment shard_part(const segment& s) const {
    const std::size_t begin = std::max(s.offset, shard_begin);
    const std::size_t end = std::min(s.offset + s.count, shard_begin + shard);
    if (end <= begin) return {s.tensor, 0, 0};
    return {s.tensor + (begin - s.offset), begin - shard_begin, end - begin};
  }

 private:
  // The update policy asked for the gradients' reduction: all of them (all_reduce) or this
  // rank's shard (reduce_scatter). The hook carries it; the control floats go in f32 beside,
  // unless the hook chose the plain reduction, which carries them in its own collective.
  void start_reduction(bool scatter) {
    scatters = scatter;
    control_in_reduction = false;
    hook_view io(*this);
    hook->reduce(io);
    if (control && !control_in_reduction) {
      float* c = grads.data() + padded;
      control_work.emplace(comm->all_reduce(const_buffer{c, control, dtype::f32}, mutable_buffer{c, control, dtype::f32},
                                            reduce_op::avg));
    }
  }

  void track(work_type w) {
    if (!work) work.emplace(std::move(w));
    else more.push_back(std::move(w));
  }

  // The bucket as its hook sees it, for one call.
  struct hook_view final : comm_hook::bucket_io_on<Device> {
    bucket& b;
    explicit hook_view(bucket& owner) : b(owner) {}
    Device& device() noexcept override { return *b.device; }
    std::size_t index() const noexcept override { return b.index; }
    std::uint64_t step() const noexcept override { return *b.steps; }
    int rank() const noexcept override { return b.comm->rank(); }
    int ranks() const noexcept override { return b.comm->size(); }
    float* gradients() noexcept override { return b.grads.data(); }
    std::size_t size() const noexcept override { return b.padded; }
    std::size_t shard_begin() const noexcept override { return b.scatters ? b.shard_begin : 0; }
    std::size_t shard() const noexcept override { return b.scatters ? b.shard : b.padded; }
    std::span<const comm_hook::tensor_layout> tensors() const noexcept override { return b.tensors; }
    void* scratch(int slot, std::size_t bytes) override { return kept(b.hook_scratch, slot, bytes).data; }
    comm_hook::hook_state state(int slot, std::size_t bytes) override { return kept(b.hook_state, slot, bytes); }
    // Slot `slot` of `arrays` at `bytes` (rounded up to floats): made and zeroed when new or resized.
    comm_hook::hook_state kept(std::vector<device_array<Device, float>>& arrays, int slot, std::size_t bytes) {
      if (slot < 0) throw error("comm_hook", "scratch", b.comm->rank(), "slot " + std::to_string(slot) + " is negative");
      const auto k = static_cast<std::size_t>(slot);
      if (arrays.size() <= k) arrays.resize(k + 1);
      auto& a = arrays[k];
      const std::size_t floats = (bytes + sizeof(float) - 1) / sizeof(float);
      if (a.size() == floats) return {a.data(), false};
      a = device_array<Device, float>(*b.device, floats);
      b.device->fill_zero(a.data(), floats * sizeof(float));
      return {a.data(), true};
    }
    void cast(const_buffer from, mutable_buffer to, float factor) override {
      if constexpr (requires { b.device->cast(from, to, factor); }) {
        b.device->cast(from, to, factor);
      } else {  // a device without the fused form: the source (this bucket's gradients) is scaled in place
        if (factor != 1.0f) b.device->scale(static_cast<float*>(const_cast<void*>(from.data)), from.count, factor);
        b.device->cast(from, to);
      }
    }
    void reduce_gradients() override {
      float* g = b.grads.data();
      if (b.scatters) return reduce_like_gradients(mutable_buffer{g, b.padded, dtype::f32}, reduce_op::avg);
      // The all_reduce carries the control floats too: one collective, as without a hook.
      const std::size_t n = b.padded + b.control;
      b.track(b.comm->all_reduce(const_buffer{g, n, dtype::f32}, mutable_buffer{g, n, dtype::f32}, reduce_op::avg));
      b.control_in_reduction = true;
    }
    void reduce_like_gradients(mutable_buffer x, reduce_op op) override {
      if (x.count != b.padded)
        throw error("comm_hook", "reduce_like_gradients", b.comm->rank(),
                    "bucket " + std::to_string(b.index) + " has " + std::to_string(b.padded) +
                        " gradient elements, but the buffer given has " + std::to_string(x.count) +
                        "; give one laid out as gradients(), of size() elements");
      if (b.scatters) {
        auto* shard = static_cast<char*>(x.data) + b.shard_begin * size_of(x.type);
        b.track(b.comm->reduce_scatter(const_buffer{x.data, b.padded, x.type}, mutable_buffer{shard, b.shard, x.type}, op));
      } else {
        b.track(b.comm->all_reduce(const_buffer{x.data, b.padded, x.type}, mutable_buffer{x.data, b.padded, x.type}, op));
      }
    }
    void all_reduce(const_buffer send, mutable_buffer recv, reduce_op op) override {
      b.track(b.comm->all_reduce(send, recv, op));
    }
    void wait() override {
      if (b.work) b.work->wait();
      for (auto& w : b.more) w.wait();
    }
  };

  bool scatters = false;              // this step's reduction is the update policy's reduce_scatter
  bool control_in_reduction = false;  // the control floats ride in `work`
};

}  // namespace ddp::detail
