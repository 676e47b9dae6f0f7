#pragma once
// Blocking forms of the communicator's collectives, written once for every backend: each takes
// the backend's blocking form where it has one (ddp/core/issue_mode.hpp: a host backend then
// runs the collective on the calling thread), else waits for the asynchronous form.
#include <span>

#include "ddp/concepts/communicator.hpp"
#include "ddp/core/buffer.hpp"
#include "ddp/core/issue_mode.hpp"

namespace ddp::comm {

namespace detail {
// `collective(args..., ddp::blocking)` where the backend has that form, else `collective(args...)`
// waited for. `collective` forwards to one member, with its return type spelled out so that a
// missing form is a substitution failure.
template <class Collective, class... Args>
void call_blocking(Collective collective, Args... args) {
  if constexpr (requires { collective(args..., blocking); })
    collective(args..., blocking);
  else
    collective(args...).wait();
}
}  // namespace detail

template <communicator C>
void all_reduce(C& comm, const_buffer send, mutable_buffer recv, reduce_op op) {
  detail::call_blocking([&](auto... a) -> decltype(comm.all_reduce(a...)) { return comm.all_reduce(a...); }, send,
                        recv, op);
}

template <communicator C>
void broadcast(C& comm, mutable_buffer buf, int root) {
  detail::call_blocking([&](auto... a) -> decltype(comm.broadcast(a...)) { return comm.broadcast(a...); }, buf, root);
}

template <communicator C>
void all_gather(C& comm, const_buffer send, mutable_buffer recv) {
  detail::call_blocking([&](auto... a) -> decltype(comm.all_gather(a...)) { return comm.all_gather(a...); }, send,
                        recv);
}

template <communicator C>
void reduce_scatter(C& comm, const_buffer send, mutable_buffer recv, reduce_op op) {
  detail::call_blocking([&](auto... a) -> decltype(comm.reduce_scatter(a...)) { return comm.reduce_scatter(a...); },
                        send, recv, op);
}

template <communicator C>
void barrier(C& comm) {
  detail::call_blocking([&](auto... a) -> decltype(comm.barrier(a...)) { return comm.barrier(a...); });
}

template <communicator C, class T>
void all_reduce(C& comm, std::span<T> data, reduce_op op) {
  all_reduce(comm, as_buffer(std::span<const T>(data)), as_buffer(data), op);
}

template <communicator C, class T>
void all_reduce(C& comm, std::span<const T> send, std::span<T> recv, reduce_op op) {
  all_reduce(comm, as_buffer(send), as_buffer(recv), op);
}

template <communicator C, class T>
T all_reduce_value(C& comm, T value, reduce_op op) {
  all_reduce(comm, std::span<T>(&value, 1), op);
  return value;
}

template <communicator C, class T>
void broadcast(C& comm, std::span<T> data, int root) {
  broadcast(comm, as_buffer(data), root);
}

template <communicator C, class T>
void all_gather(C& comm, std::span<const T> send, std::span<T> recv) {
  all_gather(comm, as_buffer(send), as_buffer(recv));
}

template <communicator C, class T>
void reduce_scatter(C& comm, std::span<const T> send, std::span<T> recv, reduce_op op) {
  reduce_scatter(comm, as_buffer(send), as_buffer(recv), op);
}

}  // namespace ddp::comm
