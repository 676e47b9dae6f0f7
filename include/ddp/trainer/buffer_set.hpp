#pragma once
// The module's buffers as the trainer keeps them in sync: the operations a buffer-sync policy
// calls (broadcast, average), each one collective per group of buffers, and the check that a
// backward reads each buffer it saved as its forward saw it.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/core/buffer_version.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/tensor.hpp"
#include "ddp/policy/buffer_sync.hpp"
#include "ddp/trainer/buffer_group.hpp"
#include "ddp/trainer/checkpoint_file.hpp"

namespace ddp::detail {

template <communicator Comm, device Device>
class buffer_set {
 public:
  struct entry {
    std::string name;
    tensor_ref value;
    buffer_version* version = nullptr;
    std::uint64_t synced_at = 0;  // version right after the trainer last overwrote it
  };

  buffer_set(Comm& comm, Device& dev, const std::vector<buffer_ref>& buffers)
      : comm_(comm), device_(dev), all_(dev, dtype::u8) {
    for (const auto& b : buffers) add(b);
  }

  const std::vector<entry>& entries() const noexcept { return entries_; }

  // Checkpoint sections "buffer/<name>": each buffer's bytes.
  void write_state(checkpoint_file& f) const {
    for (const auto& b : entries_) {
      std::vector<std::uint8_t> bytes(b.value.bytes());
      device_.copy_to_host(bytes.data(), b.value.data, bytes.size());
      f.set_bytes("buffer/" + b.name, std::move(bytes));
    }
  }
  void read_state(const checkpoint_file& f) {
    for (const auto& b : entries_) {
      const auto& bytes = f.section("buffer/" + b.name);
      if (bytes.size() != b.value.bytes())
        throw error("trainer", "load", comm_.rank(), "'" + f.path() + "': buffer '" + b.name + "' has another size");
      device_.copy_from_host(b.value.data, bytes.data(), bytes.size());
      if (b.version) b.version->bump();
    }
  }

  // Collective: every buffer takes root's bytes.
  void broadcast(int root) {
    const comm::tag_scope tag(comm::purpose::buffer_sync);
    overwrite(all_, [&](mutable_buffer b) { comm_.broadcast(b, root).wait(); });
  }

  // Collective: floating buffers averaged (one collective per dtype), the others broadcast from
  // rank 0 as bytes.
  void average() {
    const comm::tag_scope tag(comm::purpose::buffer_sync);
    build_average_groups();
    for (auto& g : average_groups_) overwrite(g, [&](mutable_buffer b) { comm_.all_reduce(b, b, reduce_op::avg).wait(); });
    overwrite(*integral_, [&](mutable_buffer b) { comm_.broadcast(b, 0).wait(); });
  }

  // Throws, naming the buffer, unless average() can average every floating buffer.
  void require_averageable() { build_average_groups(); }

  // A backward must read each buffer it saved as its forward saw it. `policy` names the
  // buffer-sync policy in the message.
  void check_saved(std::string_view policy) const {
    for (const auto& b : entries_) {
      if (!b.version) continue;
      const auto saved = b.version->innermost_saved();
      if (!saved || *saved == b.version->value()) continue;
      if (b.synced_at > *saved)
        throw error("trainer", "backward", comm_.rank(),
                    "buffer '" + b.name + "' was saved for backward at version " + std::to_string(*saved) +
                        ", then buffer_sync::" + std::string(policy) +
                        " overwrote it before this backward (now version " + std::to_string(b.version->value()) +
                        "), so the gradient would use values the forward never saw (pitfall "
                        "P1). Use ddp::buffer_sync::broadcast_once_per_step: it syncs buffers "
                        "once, before the step's first forward, so any number of forwards is safe.");
      throw error("trainer", "backward", comm_.rank(),
                  "buffer '" + b.name + "' was saved for backward at version " + std::to_string(*saved) +
                      " and modified since (now version " + std::to_string(b.version->value()) +
                      ") by the module itself; do not write a buffer that a pending backward "
                      "still needs");
    }
  }

 private:
  void add(const buffer_ref& b) {
    entries_.push_back({b.name, b.value, b.version, 0});
    all_.add(b.value);
  }

  void build_average_groups() {
    if (integral_) return;
    std::vector<buffer_group<Device>> groups;
    buffer_group<Device> integral(device_, dtype::u8);
    for (const auto& b : entries_) {
      if (!is_floating(b.value.type)) {
        integral.add(b.value);
        continue;
      }
      if (b.value.type != dtype::f32 && b.value.type != dtype::f64)
        throw error("trainer", "construct", comm_.rank(),
                    "buffer '" + b.name + "' is " + std::string(name_of(b.value.type)) +
                        "; buffer_sync::average_once_per_step averages f32 and f64 buffers (keep it in "
                        "f32, or use buffer_sync::broadcast_once_per_step)");
      auto it = std::find_if(groups.begin(), groups.end(),
                             [&](auto& g) { return g.members().front().type == b.value.type; });
      if (it == groups.end()) it = groups.insert(groups.end(), {device_, b.value.type});
      it->add(b.value);
    }
    average_groups_ = std::move(groups);
    integral_.emplace(std::move(integral));
  }

  // Runs a collective over a group of buffers, then bumps their versions (for the check of what a pending backward saved).
  template <class Collective>
  void overwrite(buffer_group<Device>& group, Collective collective) {
    group.apply(collective);
    for (const auto& t : group.members())
      for (auto& b : entries_)
        if (b.value.data == t.data && b.version) {
          b.version->bump();
          b.synced_at = b.version->value();
        }
  }

  Comm& comm_;
  Device& device_;
  std::vector<entry> entries_;
  buffer_group<Device> all_;
  std::vector<buffer_group<Device>> average_groups_;
  std::optional<buffer_group<Device>> integral_;  // set once the average groups are built
};

// The buffers as a buffer-sync policy sees them, in the trainer's current step and forward.
template <communicator Comm, device Device>
class buffer_sync_context final : public buffer_sync::context {
 public:
  buffer_sync_context(buffer_set<Comm, Device>& buffers, const std::uint64_t& step, const std::size_t& forward_index)
      : buffers_(buffers), step_(step), forward_index_(forward_index) {}
  std::uint64_t step() const noexcept override { return step_; }
  std::size_t forward_index() const noexcept override { return forward_index_; }
  void broadcast_buffers(int root) override { buffers_.broadcast(root); }
  void average_buffers() override { buffers_.average(); }
  void require_averageable() override { buffers_.require_averageable(); }

 private:
  buffer_set<Comm, Device>& buffers_;
  const std::uint64_t& step_;
  const std::size_t& forward_index_;
};

}  // namespace ddp::detail
