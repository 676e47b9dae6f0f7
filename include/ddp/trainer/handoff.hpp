#pragma once
// A trainer's part in elastic training (docs/elastic.md). Over a communicator with a hand-over
// (inproc::launch_elastic), a trainer destroyed by an exception leaves the state of its last
// completed step there (its world failed, or is about to), and a trainer built on the membership
// that goes on starts from the survivors' states.
#include <any>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <exception>
#include <optional>
#include <span>
#include <vector>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/comm/handoff.hpp"
#include "ddp/comm/host_collectives.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/reduce_op.hpp"
#include "ddp/trainer/checkpoint_file.hpp"
#include "ddp/trainer/step_observer.hpp"

namespace ddp::detail {

template <class Comm>
concept hands_over = requires(const Comm& c) {
  { c.handoff() } -> std::same_as<elastic::rank_handoff>;
};

template <class Comm>
class trainer_handoff {
 public:
  explicit trainer_handoff(const Comm& comm) {
    if constexpr (hands_over<Comm>) {
      handoff_ = comm.handoff();
      if (handoff_) index_ = handoff_.shared().next_trainer(handoff_.rank());
    }
  }
  // The states to start from, one per rank of this membership; null when there are none.
  const std::vector<std::any>* resume_files() const {
    return handoff_ ? handoff_.shared().resume_files(index_) : nullptr;
  }
  bool resume_whole() const { return handoff_ && handoff_.shared().resume_whole(index_); }
  // Whether a state left here is encoded (it goes to disk) or kept as the file object.
  bool encodes_states() const { return handoff_ && handoff_.shared().encodes_states(); }
  // Destroyed by an exception thrown after this trainer was built, in an elastic run.
  bool unwinding() const noexcept { return handoff_ && std::uncaught_exceptions() > uncaught_; }
  std::optional<elastic::saved_checkpoint> resume_checkpoint() const {
    return handoff_ ? handoff_.shared().resume_checkpoint(index_) : std::nullopt;
  }
  void leave(std::any file, bool whole, std::uint64_t steps, std::optional<elastic::saved_checkpoint> checkpoint) {
    accounted_ = true;
    handoff_.shared().leave(handoff_.rank(), index_, {std::move(file), whole, steps, std::move(checkpoint)});
  }
  // Destroyed without an exception: it leaves nothing.
  void retire() noexcept {
    if (!handoff_ || accounted_) return;
    accounted_ = true;
    try {
      handoff_.shared().retire(handoff_.rank(), index_);
    } catch (...) {
    }
  }
  trainer_handoff(const trainer_handoff&) = delete;
  trainer_handoff& operator=(const trainer_handoff&) = delete;
  // A trainer whose constructor threw is accounted for too (it leaves nothing).
  ~trainer_handoff() { retire(); }
  // Tells the hand-over of this trainer's first completed step in this membership (a launcher
  // times recovery by it, and injects faults only once a membership makes progress), and of each
  // step it begins.
  // `virtual_shards`: reduction::invariant<V>'s V (0: none), the most ranks this trainer can hold,
  // so that a request to grow past it is refused when asked.
  // Where ranks are due to join, the ranks agree (one collective) whether any of them trains the
  // step: after the last, every rank shadows it in join(), and a regroup would end the membership
  // for no step; the ranks then go on, and the request is served at the next step trained.
  template <communicator C, device D>
  void watch_steps(step_observer& observer, C& comm, D& dev, std::size_t virtual_shards = 0) {
    if (!handoff_) return;
    if (virtual_shards)
      handoff_.shared().limit_world(static_cast<int>(virtual_shards),
                                    "reduction::invariant<" + std::to_string(virtual_shards) + "> holds one virtual "
                                    "shard at least per rank, so at most " + std::to_string(virtual_shards) + " ranks");
    // Where the membership ends for ranks to join, this trainer's next step throws regroup.
    observer.on_step_begin([h = handoff_, &comm, &dev](std::uint64_t steps, bool shadow) {
      const int joining = h.shared().joining_at(steps);
      if (joining == 0) return;
      const comm::tag_scope tag(comm::purpose::handover);
      float trains[1] = {shadow ? 0.0f : 1.0f};
      comm::host_all_reduce(comm, dev, std::span<float>(trains), reduce_op::max);
      if (trains[0] > 0.0f) h.shared().regroup_at(steps, joining);
    });
    observer.on_next_update([h = handoff_](std::uint64_t steps) {
      try {
        h.shared().first_step(h.rank(), steps);
      } catch (...) {
      }
    });
  }

 private:
  elastic::rank_handoff handoff_;
  std::size_t index_ = 0;
  bool accounted_ = false;  // it left its state or ended
  int uncaught_ = std::uncaught_exceptions();
};

// The files of the state that ranks handed over, as this rank reads them: a replicated update's
// files each hold the whole state (`whole`), so this rank's own is enough, and a rank that joined
// takes a peer's; other files are read whole, as a checkpoint saved at another world size is.
inline std::vector<checkpoint_file> handed_over_files(const std::vector<std::any>& handed, bool whole, int rank,
                                                      int ranks) {
  if (handed.empty() || handed.size() > static_cast<std::size_t>(ranks))
    throw error("trainer", "resume", rank,
                std::to_string(handed.size()) + " ranks handed over their state, and this membership has " +
                    std::to_string(ranks));
  std::vector<checkpoint_file> files;
  const auto peer = static_cast<std::size_t>(rank) % handed.size();
  for (std::size_t r = 0; r < handed.size(); ++r)
    if (!whole || r == peer) {
      const auto& any = handed[r];
      if (const auto* encoded = std::any_cast<elastic::encoded_state>(&any))
        files.push_back(checkpoint_file::decode(encoded->bytes, encoded->origin));
      else
        files.push_back(std::any_cast<const checkpoint_file&>(any));
    }
  return files;
}

}  // namespace ddp::detail
