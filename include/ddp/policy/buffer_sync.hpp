#pragma once
// BufferSync: how module buffers (running statistics, counters) are kept equal across ranks.
//
//   none                      buffers stay per rank; no communication.
//   broadcast_each_forward    rank 0's buffers are broadcast before every forward (PyTorch's
//                             broadcast_buffers=True). A backward that still needs a buffer an
//                             intervening broadcast overwrote is reported by name (P1).
//   broadcast_once_per_step   rank 0's buffers are broadcast once, before the step's first
//                             forward. Any number of forwards per step is safe. The default.
//   average_once_per_step     before the first forward, floating buffers are averaged over the
//                             ranks and integer buffers broadcast from rank 0.
#include <string_view>

#include "ddp/policy/slots.hpp"

namespace ddp::buffer_sync {

struct slot;

struct none {
  using slot = buffer_sync::slot;
  static constexpr std::string_view name = "none";
};
struct broadcast_each_forward {
  using slot = buffer_sync::slot;
  static constexpr std::string_view name = "broadcast_each_forward";
};
struct broadcast_once_per_step {
  using slot = buffer_sync::slot;
  static constexpr std::string_view name = "broadcast_once_per_step";
};
struct average_once_per_step {
  using slot = buffer_sync::slot;
  static constexpr std::string_view name = "average_once_per_step";
};

struct slot {
  static constexpr std::string_view name = "buffer_sync";
  using default_policy = broadcast_once_per_step;
};

}  // namespace ddp::buffer_sync
