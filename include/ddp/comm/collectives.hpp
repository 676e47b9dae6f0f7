#pragma once
// Typed, blocking forms of the communicator's collectives, written once for every backend:
// each wraps the asynchronous member and waits.
#include <span>

#include "ddp/concepts/communicator.hpp"
#include "ddp/core/buffer.hpp"

namespace ddp {

template <communicator C, class T>
void all_reduce(C& comm, std::span<T> data, reduce_op op) {
  comm.all_reduce(as_buffer(std::span<const T>(data)), as_buffer(data), op).wait();
}

template <communicator C, class T>
void all_reduce(C& comm, std::span<const T> send, std::span<T> recv, reduce_op op) {
  comm.all_reduce(as_buffer(send), as_buffer(recv), op).wait();
}

template <communicator C, class T>
T all_reduce_value(C& comm, T value, reduce_op op) {
  all_reduce(comm, std::span<T>(&value, 1), op);
  return value;
}

template <communicator C, class T>
void broadcast(C& comm, std::span<T> data, int root) {
  comm.broadcast(as_buffer(data), root).wait();
}

template <communicator C, class T>
void all_gather(C& comm, std::span<const T> send, std::span<T> recv) {
  comm.all_gather(as_buffer(send), as_buffer(recv)).wait();
}

template <communicator C, class T>
void reduce_scatter(C& comm, std::span<const T> send, std::span<T> recv, reduce_op op) {
  comm.reduce_scatter(as_buffer(send), as_buffer(recv), op).wait();
}

template <communicator C>
void barrier(C& comm) {
  comm.barrier().wait();
}

}  // namespace ddp
