#pragma once
// The communicator concept: what every backend (in-process threads, MPI, NCCL) provides.
//
// Contract, for every collective below (as nccl.h states its own):
//   Counts     are in elements of the buffer's dtype, never bytes. Every rank passes the same
//              count, dtype, op and root; a backend that can see a mismatch reports it as a
//              ddp::error naming the ranks and the differing values.
//   In place   when send.data == recv.data (all_reduce), or for broadcast always. all_gather
//              and reduce_scatter run in place when the rank's own block of the larger buffer
//              is the smaller one (recv.data + rank*count == send.data, and the mirror).
//              Other partial overlaps are undefined.
//   Ordering   collectives of one communicator run in the order they were issued on that
//              rank, and every rank must issue the same sequence. A collective observes every
//              write to its buffers issued before the call: by the calling thread (host
//              backends) or on the compute queue the communicator is bound to (device backends).
//   Blocking   every member returns a work handle at once (asynchronous); the buffers must stay
//              alive and untouched until wait() returns. Blocking forms are the free functions
//              in ddp/comm/collectives.hpp: call, then wait().
//   Failure    a failure or timeout on any rank makes every rank's pending and later collectives
//              throw ddp::error (ddp::peer_error naming the rank at fault); none hangs.
//
// Members:
//   int rank() const, int size() const
//   static constexpr ddp::device_kind memory_kind      where the buffers must live
//   static constexpr std::string_view backend_name
//   all_reduce(const_buffer send, mutable_buffer recv, reduce_op)     send.count == recv.count
//   broadcast(mutable_buffer buf, int root)                           root's buf to every rank
//   all_gather(const_buffer send, mutable_buffer recv)                recv.count == size*send.count,
//                                                                     rank r's block at r*send.count
//   reduce_scatter(const_buffer send, mutable_buffer recv, reduce_op) send.count == size*recv.count,
//                                                                     rank r gets block r reduced
//   barrier()                                                         no rank leaves before all arrive
//   abort(const std::string& reason)   this rank gives up: every pending and later collective,
//                                      on every rank, fails with ddp::peer_error naming this rank
//                                      and the reason (a backend that cannot tell its peers ends
//                                      the job instead). Never blocks.
//
// Example:
//   ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) {
//     std::vector<float> v(4, float(comm.rank()));
//     ddp::comm::all_reduce(comm, std::span(v), ddp::reduce_op::sum);   // every element is 1
//   });
#include <concepts>
#include <string>
#include <string_view>

#include "ddp/concepts/work.hpp"
#include "ddp/core/buffer.hpp"
#include "ddp/core/device_id.hpp"
#include "ddp/core/reduce_op.hpp"

namespace ddp {

namespace communicator_requirements {

template <class C>
concept has_rank = requires(const C& c) { { c.rank() } -> std::convertible_to<int>; };
template <class C>
concept has_size = requires(const C& c) { { c.size() } -> std::convertible_to<int>; };
template <class C>
concept has_memory_kind = requires { { C::memory_kind } -> std::convertible_to<device_kind>; };
template <class C>
concept has_backend_name =
    requires { { C::backend_name } -> std::convertible_to<std::string_view>; };
template <class C>
concept has_all_reduce = requires(C& c, const_buffer s, mutable_buffer r, reduce_op op) {
  { c.all_reduce(s, r, op) } -> work_handle;
};
template <class C>
concept has_broadcast = requires(C& c, mutable_buffer b, int root) {
  { c.broadcast(b, root) } -> work_handle;
};
template <class C>
concept has_all_gather = requires(C& c, const_buffer s, mutable_buffer r) {
  { c.all_gather(s, r) } -> work_handle;
};
template <class C>
concept has_reduce_scatter = requires(C& c, const_buffer s, mutable_buffer r, reduce_op op) {
  { c.reduce_scatter(s, r, op) } -> work_handle;
};
template <class C>
concept has_barrier = requires(C& c) { { c.barrier() } -> work_handle; };
template <class C>
concept has_abort = requires(C& c, const std::string& reason) { c.abort(reason); };

}  // namespace communicator_requirements

template <class C>
concept communicator =
    communicator_requirements::has_rank<C> && communicator_requirements::has_size<C> &&
    communicator_requirements::has_memory_kind<C> &&
    communicator_requirements::has_backend_name<C> &&
    communicator_requirements::has_all_reduce<C> && communicator_requirements::has_broadcast<C> &&
    communicator_requirements::has_all_gather<C> &&
    communicator_requirements::has_reduce_scatter<C> && communicator_requirements::has_barrier<C> &&
    communicator_requirements::has_abort<C>;

// Names every missing member in its own error; use at a boundary that takes a communicator:
//   static_assert(ddp::diagnose_communicator<Comm>());
template <class C>
consteval bool diagnose_communicator() {
  namespace r = communicator_requirements;
  static_assert(r::has_rank<C>, "ddp: the communicator lacks `int rank() const`");
  static_assert(r::has_size<C>, "ddp: the communicator lacks `int size() const`");
  static_assert(r::has_memory_kind<C>,
                "ddp: the communicator lacks `static constexpr ddp::device_kind memory_kind`");
  static_assert(r::has_backend_name<C>,
                "ddp: the communicator lacks `static constexpr std::string_view backend_name`");
  static_assert(r::has_all_reduce<C>,
                "ddp: the communicator lacks `all_reduce(const_buffer, mutable_buffer, reduce_op)` "
                "returning a work handle (wait(), bool test())");
  static_assert(r::has_broadcast<C>,
                "ddp: the communicator lacks `broadcast(mutable_buffer, int root)` returning a "
                "work handle");
  static_assert(r::has_all_gather<C>,
                "ddp: the communicator lacks `all_gather(const_buffer, mutable_buffer)` returning "
                "a work handle");
  static_assert(r::has_reduce_scatter<C>,
                "ddp: the communicator lacks `reduce_scatter(const_buffer, mutable_buffer, "
                "reduce_op)` returning a work handle");
  static_assert(r::has_barrier<C>,
                "ddp: the communicator lacks `barrier()` returning a work handle");
  static_assert(r::has_abort<C>,
                "ddp: the communicator lacks `abort(const std::string& reason)`");
  return communicator<C>;
}

}  // namespace ddp
