#pragma once
// Blocking collectives on small host vectors for any communicator/device pair: when the
// communicator needs device memory (NCCL) the data is staged through the device.
#include <span>
#include <vector>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/device_array.hpp"

namespace ddp::detail {

// `start(p)` starts a collective over p and returns its work handle.
template <communicator C, device D, class T, class Start>
void staged([[maybe_unused]] C& comm, D& dev, std::span<T> host, std::size_t device_count, Start start) {
  if constexpr (C::memory_kind == device_kind::cpu) {
    start(host.data()).wait();
  } else {
    device_array<D, T> staging(dev, device_count);
    dev.copy_from_host(staging.data(), host.data(), host.size_bytes());
    auto w = start(staging.data());
    w.wait();
    dev.copy_to_host(host.data(), staging.data(), host.size_bytes());
    rethrow_failure(w);  // a stream backend's collective may have been aborted under the copy
  }
}

template <communicator C, device D, class T>
void host_all_reduce(C& comm, D& dev, std::span<T> data, reduce_op op) {
  staged(comm, dev, data, data.size(), [&](T* p) {
    return comm.all_reduce(const_buffer{p, data.size(), dtype_of<T>}, mutable_buffer{p, data.size(), dtype_of<T>}, op);
  });
}

template <communicator C, device D, class T>
void host_broadcast(C& comm, D& dev, std::span<T> data, int root) {
  staged(comm, dev, data, data.size(),
         [&](T* p) { return comm.broadcast(mutable_buffer{p, data.size(), dtype_of<T>}, root); });
}

// Returns every rank's `mine`, rank after rank.
template <communicator C, device D, class T>
std::vector<T> host_all_gather(C& comm, D& dev, std::span<const T> mine) {
  std::vector<T> all(mine.size() * static_cast<std::size_t>(comm.size()));
  const std::size_t offset = mine.size() * static_cast<std::size_t>(comm.rank());
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(offset));
  staged(comm, dev, std::span<T>(all), all.size(), [&](T* p) {
    return comm.all_gather(const_buffer{p + offset, mine.size(), dtype_of<T>},
                           mutable_buffer{p, all.size(), dtype_of<T>});
  });
  return all;
}

}  // namespace ddp::detail
