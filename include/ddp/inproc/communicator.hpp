#pragma once
// The in-process communicator: N ranks as threads of one process, collectives over shared
// memory. Each rank runs its collectives on its own progress thread, in issue order.
//
// all_reduce is a reduce-scatter fused with an all-gather: rank r reduces slice r of every
// rank's input (ranks in order 0..N-1, so every rank and every run gets the same bits) and
// writes the result into slice r of every rank's output. Each rank reads and writes about the
// buffer's size once, as a copy would; nothing funnels through rank 0.
#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/comm/progress_thread.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/host/kernels.hpp"
#include "ddp/inproc/world.hpp"

namespace ddp::inproc {

class communicator {
 public:
  static constexpr device_kind memory_kind = device_kind::cpu;
  static constexpr std::string_view backend_name = "inproc";

  // The flight recorder (comm/flight_recorder.hpp) takes the world's options.recorder, or the
  // environment's settings.
  communicator(std::shared_ptr<inproc::world> w, int rank)
      : world_(std::move(w)),
        rank_(rank),
        recorder_(backend_name, rank, world_->size(),
                  world_->settings().recorder.value_or(comm::recorder_options::from_environment())),
        progress_(comm::progress_options{.spin = world_->spin_budget()}) {
    if (rank < 0 || rank >= world_->size())
      throw error("inproc", "communicator", rank,
                  "rank " + std::to_string(rank) + " is outside a world of size " +
                      std::to_string(world_->size()));
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return world_->size(); }
  const inproc::world& world() const noexcept { return *world_; }

  template <issue_mode How = asynchronous_t>
  auto all_reduce(const_buffer send, mutable_buffer recv, reduce_op op, How how = How{}) {
    return issue(how, "all_reduce", send.count, send.type, op, 0, send.data, recv.data,
                  [=, this](const std::vector<slot*>& slots) {
                    require(recv.count == send.count && recv.type == send.type,
                            "all_reduce", "recv must have the count and dtype of send");
                    reduce_slice(slots, send.count, send.type, op, /*block=*/0, /*all=*/true);
                  });
  }

  template <issue_mode How = asynchronous_t>
  auto broadcast(mutable_buffer buf, int root, How how = How{}) {
    return issue(how, "broadcast", buf.count, buf.type, reduce_op::sum, root, buf.data, buf.data,
                  [=, this](const std::vector<slot*>& slots) {
                    require_root(root, "broadcast");
                    const auto [begin, end] = my_slice(buf.count, buf.type);
                    const std::size_t es = size_of(buf.type);
                    const auto* src = static_cast<const char*>(slots[root]->send) + begin * es;
                    for (int k = 0; k < size(); ++k)
                      if (k != root && end > begin)
                        std::memcpy(static_cast<char*>(slots[k]->recv) + begin * es, src,
                                    (end - begin) * es);
                  });
  }

  template <issue_mode How = asynchronous_t>
  auto all_gather(const_buffer send, mutable_buffer recv, How how = How{}) {
    return issue(how, "all_gather", send.count, send.type, reduce_op::sum, 0, send.data, recv.data,
                  [=, this](const std::vector<slot*>& slots) {
                    require(recv.count == send.count * size() && recv.type == send.type,
                            "all_gather", "recv must hold size() * send.count elements of send's dtype");
                    const std::size_t bytes = send.bytes();
                    for (int k = 0; k < size(); ++k) {
                      char* dst = static_cast<char*>(slots[k]->recv) + rank_ * bytes;
                      if (bytes && dst != send.data) std::memcpy(dst, send.data, bytes);
                    }
                  });
  }

  template <issue_mode How = asynchronous_t>
  auto reduce_scatter(const_buffer send, mutable_buffer recv, reduce_op op, How how = How{}) {
    return issue(how, "reduce_scatter", recv.count, send.type, op, 0, send.data, recv.data,
                  [=, this](const std::vector<slot*>& slots) {
                    require(send.count == recv.count * size() && recv.type == send.type,
                            "reduce_scatter",
                            "send must hold size() * recv.count elements of recv's dtype");
                    reduce_slice(slots, recv.count, send.type, op, rank_, /*all=*/false);
                  });
  }

  void abort(const std::string& reason) {
    recorder_.dump_once("this rank aborted: " + reason);
    world_->fail(rank_, reason);
  }

  // The last collectives this rank issued (comm/flight_recorder.hpp).
  comm::flight_recorder& recorder() noexcept { return recorder_; }
  const comm::flight_recorder& recorder() const noexcept { return recorder_; }

  // This rank's part of elastic training's hand-over (empty unless launched by launch_elastic).
  elastic::rank_handoff handoff() const noexcept { return {world_->handoff(), rank_}; }

  template <issue_mode How = asynchronous_t>
  auto barrier(How how = How{}) {
    return issue(how, "barrier", 0, dtype::u8, reduce_op::sum, 0, nullptr, nullptr,
                  [](const std::vector<slot*>&) {});
  }

 private:
  template <issue_mode How, class Body>
  auto issue(How how, const char* name, std::size_t count, dtype type, reduce_op op, int root, const void* send,
             void* recv, Body body) {
    const collective_call call{name, next_sequence_++, count, type, op, root};
    const std::uint64_t recorded =
        recorder_.issued(name, count, type, op, std::string_view(name) == "broadcast" ? root : -1);
    return progress_.issue(how, [=, this] {
      recorder_.started(recorded);
      try {
        run(call, send, recv, body);
      } catch (const std::exception& e) {
        recorder_.dump_once(e.what());
        throw;
      }
      recorder_.completed(recorded);
    });
  }

  template <class Body>
  void run(const collective_call& call, const void* send, void* recv, const Body& body) {
    try {
      // Peers read this slot only between the two barriers of a collective, and this rank
      // departed from the previous one only once every peer had: nobody reads it now.
      world_->slot_of(rank_) = slot{call, send, recv};
      world_->arrive_and_wait(rank_, call);  // throws on every rank or on none
    } catch (const peer_error&) {
      throw;
    } catch (const std::exception& e) {
      world_->fail(rank_, e.what());
      throw;
    }
    std::exception_ptr failure;
    try {
      std::vector<slot*> slots(size());
      for (int k = 0; k < size(); ++k) slots[k] = &world_->slot_of(k);
      for (int k = 0; k < size(); ++k)
        if (!(slots[k]->call == call))
          throw error("inproc", call.name, rank_,
                      "ranks disagree on the collective: rank " + std::to_string(rank_) +
                          " issued " + call.describe() + ", rank " + std::to_string(k) +
                          " issued " + slots[k]->call.describe() +
                          "; every rank must issue the same collectives in the same order (ranks that run "
                          "different numbers of steps: a rank out of batches calls trainer.join())");
      body(slots);
    } catch (const std::exception& e) {
      failure = std::current_exception();
      world_->fail(rank_, e.what());
    } catch (...) {
      failure = std::current_exception();
      world_->fail(rank_, "unknown exception in " + call.describe());
    }
    // Every peer's body may still read this rank's buffers and write into them, whatever failed
    // meanwhile: return (and let the caller free them) only once all are done.
    world_->depart();
    if (failure) std::rethrow_exception(failure);
  }

  // `what` is a literal: a collective builds no message unless it fails.
  void require(bool ok, const char* op, const char* what) const {
    if (!ok) throw error("inproc", op, rank_, what);
  }
  void require_root(int root, const char* op) const {
    if (root < 0 || root >= size()) throw error("inproc", op, rank_, "root " + std::to_string(root) + " is not a rank");
  }

  // This rank's share [begin, end) of n elements, cut on 64-byte boundaries.
  std::pair<std::size_t, std::size_t> my_slice(std::size_t n, dtype type) const {
    const std::size_t align = std::max<std::size_t>(1, 64 / size_of(type));
    const std::size_t per = (n + size() - 1) / size();
    const std::size_t share = (per + align - 1) / align * align;
    const std::size_t begin = std::min(n, share * rank_);
    return {begin, std::min(n, begin + share)};
  }

  // all=true: reduce my slice of the whole buffer into every rank's recv (all_reduce).
  // all=false: reduce block `block` (recv-count elements) of every send into my recv.
  void reduce_slice(const std::vector<slot*>& slots, std::size_t n, dtype type, reduce_op op,
                    int block, bool all) const {
    if (size() == 1) {  // every op of one rank is the identity: at most a copy
      if (n && slots[0]->send != slots[0]->recv) std::memcpy(slots[0]->recv, slots[0]->send, n * size_of(type));
      return;
    }
    if (host::is_half(type)) {
      host::visit_half_dtype(type, [&]<class F>(F) {
        reduce_slice_as<std::uint16_t>(slots, n, type, op, block, all, [](auto sources, auto targets, auto len,
                                                                         auto o, auto w) {
          host::reduce_to_all_half<F>(sources, targets, len, o, w);
        });
      });
      return;
    }
    visit_host_dtype(type, [&]<class T>(T) {
      reduce_slice_as<T>(slots, n, type, op, block, all, [](auto sources, auto targets, auto len, auto o, auto w) {
        host::reduce_to_all<T>(sources, targets, len, o, w);
      });
    });
  }

  // reduce_slice over elements of type T, with `reduce(sources, targets, len, op, world)`.
  template <class T, class Reduce>
  void reduce_slice_as(const std::vector<slot*>& slots, std::size_t n, dtype type, reduce_op op, int block, bool all,
                       const Reduce& reduce) const {
    std::vector<const T*> sources(size());
    std::vector<T*> targets;
    std::size_t begin = 0, len = n;
    if (all) {
      const auto [b, e] = my_slice(n, type);
      begin = b;
      len = e - b;
      for (int k = 0; k < size(); ++k) targets.push_back(static_cast<T*>(slots[k]->recv) + begin);
    } else {
      begin = static_cast<std::size_t>(block) * n;
      targets.push_back(static_cast<T*>(slots[rank_]->recv));
    }
    if (len == 0) return;
    for (int k = 0; k < size(); ++k) sources[k] = static_cast<const T*>(slots[k]->send) + begin;
    reduce(std::span<const T* const>(sources), std::span<T* const>(targets), len, op,
           static_cast<std::size_t>(size()));
  }

  std::shared_ptr<inproc::world> world_;
  int rank_;
  std::uint64_t next_sequence_ = 0;
  comm::flight_recorder recorder_;
  comm::progress_thread progress_;  // last: joined first, while the members it uses still exist
};

static_assert(diagnose_communicator<communicator>());

}  // namespace ddp::inproc
