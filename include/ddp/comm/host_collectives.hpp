#pragma once
// Blocking collectives on small host vectors for any communicator/device pair: when the
// communicator needs device memory (NCCL) the data is staged through the device; in host memory
// they are the blocking free functions (collectives.hpp).
#include <span>
#include <vector>

#include "ddp/comm/collectives.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"

namespace ddp::comm {

// Through device memory: `start(p)` starts the collective over p and returns its work handle.
template <device D, class T, class Start>
void staged(D& dev, std::span<T> host, std::size_t device_count, Start start) {
  device_array<D, T> staging(dev, device_count);
  dev.copy_from_host(staging.data(), host.data(), host.size_bytes());
  auto w = start(staging.data());
  w.wait();
  dev.copy_to_host(host.data(), staging.data(), host.size_bytes());
  rethrow_failure(w);  // a stream backend's collective may have been aborted under the copy
}

template <communicator C, device D, class T>
void host_all_reduce(C& comm, [[maybe_unused]] D& dev, std::span<T> data, reduce_op op) {
  if constexpr (C::memory_kind == device_kind::cpu)
    ddp::comm::all_reduce(comm, data, op);
  else
    staged(dev, data, data.size(), [&](T* p) {
      const mutable_buffer b{p, data.size(), dtype_of<T>};
      return comm.all_reduce(b, b, op);
    });
}

template <communicator C, device D, class T>
void host_broadcast(C& comm, [[maybe_unused]] D& dev, std::span<T> data, int root) {
  if constexpr (C::memory_kind == device_kind::cpu)
    ddp::comm::broadcast(comm, data, root);
  else
    staged(dev, data, data.size(),
           [&](T* p) { return comm.broadcast(mutable_buffer{p, data.size(), dtype_of<T>}, root); });
}

// Returns every rank's `mine`, rank after rank.
template <communicator C, device D, class T>
std::vector<T> host_all_gather(C& comm, [[maybe_unused]] D& dev, std::span<const T> mine) {
  std::vector<T> all(mine.size() * static_cast<std::size_t>(comm.size()));
  const std::size_t offset = mine.size() * static_cast<std::size_t>(comm.rank());
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(offset));
  // In place: this rank's block is where it goes.
  auto send = [&](T* p) { return const_buffer{p + offset, mine.size(), dtype_of<T>}; };
  auto recv = [&](T* p) { return mutable_buffer{p, all.size(), dtype_of<T>}; };
  if constexpr (C::memory_kind == device_kind::cpu)
    ddp::comm::all_gather(comm, send(all.data()), recv(all.data()));
  else
    staged(dev, std::span<T>(all), all.size(), [&](T* p) { return comm.all_gather(send(p), recv(p)); });
  return all;
}

}  // namespace ddp::comm
