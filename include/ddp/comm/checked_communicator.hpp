#pragma once
// The checking mode: a communicator that, before each collective, has the ranks agree on its
// fingerprint (sequence id, op, count, dtype, root, reduce op, the trainer's tag) in one small
// all_gather, and runs the collective only when every rank issued the same. A mismatch is a
// ddp::error on every rank (each sees every fingerprint), naming both sides: MPI ranks no longer
// end inside MPI, and an NCCL job no longer waits for its watchdog.
//
//   ddp::inproc::launch(3, [](ddp::inproc::communicator& inner) {
//     ddp::comm::checked_communicator comm(inner);   // a communicator like any other
//     ...
//   });
//
// The fingerprints travel on `agree` (by default the wrapped communicator itself), which must
// take host memory: for a device communicator (NCCL), give the host communicator that
// bootstrapped it. Cost: one blocking all_gather of 40 bytes per rank before each collective
// (docs/debugging.md measures it); the collective itself still runs asynchronously, but its
// issue waits for every rank to reach the agreement. A tool for finding a mismatch, not for
// training fast. The
// agreement's all_gathers are left out of the flight recorder; on a mismatch each rank notes what
// it issued there and dumps, so ddp-why names the same collective as the error.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/core/buffer.hpp"
#include "ddp/core/error.hpp"

namespace ddp::comm {

// One collective as the checking mode compares it.
struct fingerprint {
  std::uint64_t sequence = 0;
  std::uint64_t count = 0;
  std::int64_t step = -1;
  std::int32_t bucket = -1;
  std::int32_t root = -1;
  std::uint8_t op = 0;  // index into fingerprint::ops
  std::uint8_t type = 0;
  std::uint8_t reduction = 0;
  std::uint8_t what = 0;
  std::uint8_t padding[4] = {};

  static constexpr const char* ops[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"};

  bool same_call(const fingerprint& o) const {
    return sequence == o.sequence && count == o.count && root == o.root && op == o.op && type == o.type &&
           reduction == o.reduction;
  }
  std::string describe() const {
    std::string d = std::string(ops[op]) + " #" + std::to_string(sequence) + " (count " + std::to_string(count) +
                    ", " + std::string(name_of(static_cast<dtype>(type)));
    if (op == 0 || op == 3) d += ", " + std::string(name_of(static_cast<reduce_op>(reduction)));
    if (root >= 0) d += ", root " + std::to_string(root);
    d += step >= 0 ? "; step " + std::to_string(step) + ", " : std::string("; outside a step, ");
    if (bucket >= 0) d += "bucket " + std::to_string(bucket) + ", ";
    return d + std::string(name_of(static_cast<purpose>(what))) + ")";
  }
};
static_assert(sizeof(fingerprint) == 40);

template <communicator Comm, communicator Agree = Comm>
class checked_communicator {
  static_assert(Agree::memory_kind == device_kind::cpu,
                "ddp: checked_communicator agrees on fingerprints in host memory: give a host communicator "
                "(ddp::inproc, ddp::mpi) as `agree`, e.g. the one that bootstrapped the NCCL communicator");

 public:
  static constexpr device_kind memory_kind = Comm::memory_kind;
  static constexpr std::string_view backend_name = Comm::backend_name;

  explicit checked_communicator(Comm& inner)
    requires std::same_as<Comm, Agree>
      : inner_(&inner), agree_(&inner) {}
  checked_communicator(Comm& inner, Agree& agree) : inner_(&inner), agree_(&agree) {}

  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }
  Comm& inner() noexcept { return *inner_; }

  auto all_reduce(const_buffer send, mutable_buffer recv, reduce_op op) {
    check(0, send.count, send.type, op, -1);
    return inner_->all_reduce(send, recv, op);
  }
  auto broadcast(mutable_buffer buf, int root) {
    check(1, buf.count, buf.type, reduce_op::sum, root);
    return inner_->broadcast(buf, root);
  }
  auto all_gather(const_buffer send, mutable_buffer recv) {
    check(2, send.count, send.type, reduce_op::sum, -1);
    return inner_->all_gather(send, recv);
  }
  auto reduce_scatter(const_buffer send, mutable_buffer recv, reduce_op op) {
    check(3, recv.count, send.type, op, -1);
    return inner_->reduce_scatter(send, recv, op);
  }
  auto barrier() {
    check(4, 0, dtype::u8, reduce_op::sum, -1);
    return inner_->barrier();
  }
  void abort(const std::string& reason) { inner_->abort(reason); }

  auto handoff() const
    requires requires(const Comm& c) { c.handoff(); }
  {
    return inner_->handoff();
  }

 private:
  void check(std::uint8_t op, std::size_t count, dtype type, reduce_op reduction, int root) {
    const collective_tag tag = current_tag();
    fingerprint mine;
    mine.sequence = next_sequence_++;
    mine.count = count;
    mine.step = tag.step;
    mine.bucket = tag.bucket;
    mine.root = root;
    mine.op = op;
    mine.type = static_cast<std::uint8_t>(type);
    mine.reduction = static_cast<std::uint8_t>(reduction);
    mine.what = static_cast<std::uint8_t>(tag.what);
    all_.resize(static_cast<std::size_t>(size()));
    {
      tag_scope agreeing(purpose::fingerprint);
      agree_->all_gather(const_buffer{&mine, sizeof mine, dtype::u8},
                         mutable_buffer{all_.data(), all_.size() * sizeof mine, dtype::u8})
          .wait();
    }
    // Every rank sees every fingerprint and decides alike: the majority's is the expected one.
    int expected = 0, agreeing_with_expected = 0;
    for (int r = 0; r < size(); ++r) {
      int same = 0;
      for (int k = 0; k < size(); ++k) same += all_[r].same_call(all_[k]);
      if (same > agreeing_with_expected) expected = r, agreeing_with_expected = same;
    }
    if (agreeing_with_expected == size()) return;
    std::string sides;
    std::vector<bool> told(all_.size(), false);
    for (int r = 0; r < size(); ++r) {
      if (told[r]) continue;
      std::string ranks;
      for (int k = r; k < size(); ++k)
        if (!told[k] && all_[k].same_call(all_[r])) {
          told[k] = true;
          ranks += (ranks.empty() ? "" : ", ") + std::to_string(k);
        }
      sides += (sides.empty() ? "" : "; ") + std::string(ranks.find(',') == std::string::npos ? "rank " : "ranks ") +
               ranks + " issued " + all_[r].describe();
    }
    std::string odd;
    for (int r = 0; r < size(); ++r)
      if (!all_[r].same_call(all_[expected])) odd += (odd.empty() ? "" : ", ") + std::to_string(r);
    const std::string what = "ranks disagree on collective #" + std::to_string(mine.sequence) + ": " + sides +
                             " (differs from the others: rank " + odd +
                             "); every rank must issue the same collectives in the same order: look for a "
                             "rank-dependent branch or a policy chosen differently per rank" +
                             policy_hint();
    // The flight recorder notes what this rank issued (never started), so that ddp-why's verdict on
    // the dumps names the same collective.
    if constexpr (requires { inner_->recorder().dump_once(what); }) {
      inner_->recorder().issued(fingerprint::ops[op], count, type, reduction, root);
      inner_->recorder().dump_once(what);
    }
    throw error("checked", fingerprint::ops[op], rank(), what);
  }

  // A trainer agrees on its policies at the first step after a one_of's select(): ranks that
  // agree where the others issue something else selected where the others did not.
  std::string policy_hint() const {
    std::string agreeing;
    int count = 0;
    for (int r = 0; r < size(); ++r)
      if (all_[r].what == static_cast<std::uint8_t>(purpose::policy_agreement))
        agreeing += (agreeing.empty() ? "" : ", ") + std::to_string(r), ++count;
    if (count == 0 || count == size()) return {};
    return std::string("; ") + (count == 1 ? "rank " : "ranks ") + agreeing + (count == 1 ? " agrees" : " agree") +
           " on the trainer's policies, as a trainer does at the first step after a one_of's select(), where the "
           "others do not: select alike on every rank, before the same step";
  }

  Comm* inner_;
  Agree* agree_;
  std::uint64_t next_sequence_ = 0;
  std::vector<fingerprint> all_;
};

template <class Comm>
checked_communicator(Comm&) -> checked_communicator<Comm, Comm>;

}  // namespace ddp::comm
