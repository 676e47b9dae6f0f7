#pragma once
// Elastic training's hand-over (docs/elastic.md): when a membership fails, each rank's trainers
// leave here the state of their last completed step, as checkpoint files held in memory; the
// launcher keeps the survivors' states, and the trainers of the next, smaller membership start
// from them. A rank's trainers are told apart by the order they were built in. Ranks join a
// running membership the same way: at a step boundary every rank of it ends its membership
// (elastic::regroup), leaves its state, and the larger one starts from it.
#include <algorithm>
#include <any>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::elastic {

// A committed checkpoint a trainer saved or loaded last: where a sharded update falls back to.
struct saved_checkpoint {
  std::string dir;
  std::uint64_t steps = 0;
  bool operator==(const saved_checkpoint&) const = default;
};

// A checkpoint file's bytes (a hand-over that goes to disk, between processes), and where they
// come from.
struct encoded_state {
  std::vector<std::uint8_t> bytes;
  std::string origin;
};

// Thrown by every trainer of a membership at the same step boundary so that ranks can join:
// the membership ends there as if it had failed, with nothing lost and no rank blamed, and
// launch_elastic starts the larger one. A function run under launch_elastic lets it pass.
class regroup : public std::exception {
 public:
  regroup(std::uint64_t steps, int joining)
      : steps_(steps), joining_(joining),
        what_("ddp[elastic] this membership ends after step " + std::to_string(steps) + " so that " +
              std::to_string(joining) + (joining == 1 ? " rank joins" : " ranks join") +
              "; launch_elastic starts the next one from here (a function run under it must let "
              "ddp::elastic::regroup pass: rethrow it where it catches exceptions)") {}
  const char* what() const noexcept override { return what_.c_str(); }
  std::uint64_t steps() const noexcept { return steps_; }
  int joining() const noexcept { return joining_; }

 private:
  std::uint64_t steps_;
  int joining_;
  std::string what_;
};

// One trainer's state of its last completed step: a checkpoint file, kept in memory as the
// trainer wrote it (in-process), or encoded (encoded_state) when the hand-over asks for it.
struct left_state {
  std::any file;
  // It holds the whole optimizer state (a replicated update), not one rank's shard of it.
  bool whole = false;
  std::uint64_t steps = 0;
  std::optional<saved_checkpoint> checkpoint;  // the last one this trainer saved or loaded
  // The trainer ended normally before the failure (a program's earlier phase): it leaves
  // nothing, and the trainer built in its place in the next membership starts afresh.
  bool retired = false;
};

// What the next membership starts from, for the report.
struct carried_over {
  std::uint64_t completed = 0;                 // steps the survivors had completed
  std::uint64_t resumed_at = 0;                // the step it goes on from
  std::optional<saved_checkpoint> checkpoint;  // when a sharded update fell back to one
  int joined = 0;                              // ranks that join the survivors
};

class handoff {
 public:
  explicit handoff(int world)
      : left_(static_cast<std::size_t>(world)), next_index_(static_cast<std::size_t>(world), 0),
        accounted_(static_cast<std::size_t>(world), 0) {}

  // ---- the ranks of the running membership ------------------------------------------------

  // The index of the next trainer built on `rank` in this membership (0, 1, ... in build order).
  std::size_t next_trainer(int rank) {
    std::lock_guard lock(mutex_);
    return next_index_.at(static_cast<std::size_t>(rank))++;
  }
  // What trainer `trainer` of `rank` leaves behind as its world fails.
  void leave(int rank, std::size_t trainer, left_state state) {
    if (listener_.left) listener_.left(rank, trainer, state);  // before it is stored: no copy, no lock held
    {
      std::lock_guard lock(mutex_);
      auto& mine = left_.at(static_cast<std::size_t>(rank));
      if (mine.size() <= trainer) mine.resize(trainer + 1);
      mine[trainer] = std::move(state);
    }
    account(rank);
  }
  // Trainer `trainer` of `rank` ended normally: it leaves nothing.
  void retire(int rank, std::size_t trainer) {
    {
      std::lock_guard lock(mutex_);
      auto& mine = left_.at(static_cast<std::size_t>(rank));
      if (mine.size() <= trainer) mine.resize(trainer + 1);
      mine[trainer].retired = true;
    }
    account(rank);
  }
  // Every trainer built on `rank` has left its state or ended.
  bool all_accounted(int rank) const {
    std::lock_guard lock(mutex_);
    return accounted_.at(static_cast<std::size_t>(rank)) == next_index_.at(static_cast<std::size_t>(rank));
  }
  // A trainer completed its first step in this membership (`steps` in all).
  void first_step(int rank, std::uint64_t steps) const {
    if (listener_.first_step) listener_.first_step(rank, steps);
  }
  // The files trainer `trainer` of a restarted membership starts from, one per survivor in the
  // new rank order; null on the first membership (and for a trainer the failed one did not have).
  const std::vector<std::any>* resume_files(std::size_t trainer) const {
    return trainer < resume_.size() && !resume_[trainer].empty() ? &resume_[trainer] : nullptr;
  }
  // Each of those files holds the whole state (a replicated update): a rank needs only its own.
  bool resume_whole(std::size_t trainer) const { return trainer < resume_whole_.size() && resume_whole_[trainer]; }
  // How many times the membership changed.
  int restarts() const noexcept { return restarts_; }

  // ---- ranks joining (any thread) ----------------------------------------------------------

  // `ranks` more ranks join once the run has completed `steps` steps, or at the next step
  // boundary no rank has passed when that one is behind (std::nullopt: the next one).
  // Refused (std::invalid_argument) when the world would grow past what a trainer of the run
  // can hold (limit_world).
  void grow(int ranks, std::optional<std::uint64_t> steps = std::nullopt) {
    require_ranks(ranks);
    std::lock_guard lock(mutex_);
    if (limit_) {
      int world = static_cast<int>(left_.size()) + ranks;
      for (const auto& j : joins_) world += j.ranks;
      if (world > limit_->most)
        throw std::invalid_argument("ddp: elastic grow: " + std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks") +
                                    " more would make a world of " + std::to_string(world) + " ranks, but " +
                                    limit_->why + ": ask for at most " +
                                    std::to_string(std::max(0, limit_->most - (world - ranks))) + " more");
    }
    const std::uint64_t next = begun_ ? *begun_ + 1 : 0;
    joins_.push_back({std::max(steps.value_or(next), next), ranks});
  }
  // A trainer of the run holds at most `most` ranks (`why` says so, and the fix): later requests
  // for more ranks than that are refused when asked. The smallest limit holds.
  void limit_world(int most, std::string why) {
    std::lock_guard lock(mutex_);
    if (!limit_ || most < limit_->most) limit_ = world_limit{most, std::move(why)};
  }
  // A trainer begins a step with `steps` completed: how many ranks are due to join there, where
  // the membership ends for them (every trainer of every rank at the same step: regroup_at); when
  // none, notes how far the run has gone, so that a request made now ends it at a boundary no rank
  // has passed.
  int joining_at(std::uint64_t steps) {
    std::lock_guard lock(mutex_);
    int joining = 0;
    for (const auto& j : joins_)
      if (j.at <= steps) joining += j.ranks;
    if (joining == 0) begun_ = std::max(begun_.value_or(0), steps);
    return joining;
  }
  [[noreturn]] void regroup_at(std::uint64_t steps, int joining) {
    {
      std::lock_guard lock(mutex_);
      if (!regrouped_at_) regrouped_at_ = std::chrono::steady_clock::now();
    }
    throw regroup(steps, joining);
  }
  // When the first trainer reached the boundary where the membership ended for ranks to join.
  std::optional<std::chrono::steady_clock::time_point> regrouped_at() const {
    std::lock_guard lock(mutex_);
    return regrouped_at_;
  }
  static void require_ranks(int ranks) {
    if (ranks < 1) throw std::invalid_argument("ddp: elastic grow: ranks must be at least 1, not " + std::to_string(ranks));
  }

  // ---- a launcher of processes (ddp::run::agent) ------------------------------------------

  // Told, on the rank's thread, of each state left, each trainer accounted for, and each
  // trainer's first completed step in this membership.
  struct listener {
    std::function<void(int rank, std::size_t trainer, const left_state&)> left;
    std::function<void(int rank)> accounted;  // after each state left (and told) or trainer ended
    std::function<void(int rank, std::uint64_t steps)> first_step;  // a trainer's first step here
  };
  void listen(listener l) { listener_ = std::move(l); }
  // Trainers leave their states encoded (encoded_state): they go to disk.
  void encode_states() noexcept { encode_ = true; }
  bool encodes_states() const noexcept { return encode_; }
  // Trainer `trainer` of this process's rank starts from `file` (the whole state of a replicated
  // update) or from `checkpoint` (a sharded update's fall-back): what a previous membership left.
  void resume_from(std::size_t trainer, int rank, std::any file, std::optional<saved_checkpoint> checkpoint) {
    std::lock_guard lock(mutex_);
    if (resume_.size() <= trainer) {
      resume_.resize(trainer + 1);
      resume_whole_.resize(trainer + 1);
      resume_checkpoint_.resize(trainer + 1);
    }
    if (checkpoint) {
      resume_checkpoint_[trainer] = std::move(checkpoint);
      return;
    }
    resume_[trainer].assign(left_.size(), std::any{});
    resume_[trainer][static_cast<std::size_t>(rank)] = std::move(file);
    resume_whole_[trainer] = true;
  }
  void set_restarts(int n) noexcept { restarts_ = n; }

  // ---- the launcher, between memberships --------------------------------------------------

  // A sharded update's trainer `trainer` starts from this checkpoint instead (its failed ranks'
  // shards of the optimizer state are gone; the last checkpoint every rank saved has them).
  std::optional<saved_checkpoint> resume_checkpoint(std::size_t trainer) const {
    return trainer < resume_checkpoint_.size() ? resume_checkpoint_[trainer] : std::nullopt;
  }

  // The survivors' (old ranks, in order) states become the next membership's start, with the
  // ranks asked for by the step they hold (who start from their peers' states): `carried` says
  // from where, or the reason the run cannot go on without the failed ranks is returned.
  std::optional<std::string> carry_over(const std::vector<int>& survivors, carried_over& carried) {
    std::lock_guard lock(mutex_);
    std::size_t trainers = 0;
    for (const auto& l : left_) trainers = std::max(trainers, l.size());
    auto unknown = [](int r) {
      return "rank " + std::to_string(r) + " failed outside a trainer, before its trainer held a completed step's "
             "state, or after its failed step's update had begun: its state of the last completed step is unknown";
    };
    for (int r : survivors)
      if (left_[static_cast<std::size_t>(r)].size() != trainers) return unknown(r);
    std::vector<std::vector<std::any>> next(trainers);
    std::vector<bool> whole(trainers);
    std::vector<std::optional<saved_checkpoint>> fall_back(trainers);
    const auto& lead = left_[static_cast<std::size_t>(survivors.front())];
    const auto live = std::find_if(lead.begin(), lead.end(), [](const left_state& l) { return !l.retired; });
    carried.completed = carried.resumed_at = live == lead.end() ? 0 : live->steps;
    carried.checkpoint.reset();
    for (std::size_t t = 0; t < trainers; ++t) {
      const auto& first = left_[static_cast<std::size_t>(survivors.front())][t];
      // A trainer that every survivor ended normally leaves nothing: its successor starts afresh.
      const auto retired = std::count_if(survivors.begin(), survivors.end(), [&](int r) {
        return left_[static_cast<std::size_t>(r)][t].retired;
      });
      if (retired == static_cast<std::ptrdiff_t>(survivors.size())) continue;
      if (retired > 0)
        return "trainer " + std::to_string(t) + " ended normally on some ranks and not on others: a trainer is built "
               "and destroyed on every rank alike";
      whole[t] = first.whole;
      if (!first.whole && survivors.size() != left_.size()) {
        for (int r : survivors)
          if (!first.checkpoint || left_[static_cast<std::size_t>(r)][t].checkpoint != first.checkpoint)
            return "trainer " + std::to_string(t) + " has a sharded update: the optimizer state's shard of each failed "
                   "rank went with it, and there is no checkpoint that every rank saved or loaded to go back to. Save "
                   "checkpoints (trainer.save) for the run to fall back to the last one, or use update::replicated "
                   "to go on from the last completed step";
        fall_back[t] = first.checkpoint;
        if (!carried.checkpoint) carried.resumed_at = first.checkpoint->steps, carried.checkpoint = first.checkpoint;
        continue;
      }
      for (int r : survivors) {
        auto& s = left_[static_cast<std::size_t>(r)][t];
        if (!s.file.has_value()) return unknown(r);  // a sharded update's fall-back needs no file
        if (s.steps != first.steps)
          return "the survivors hold different steps (" + std::to_string(first.steps) + " and " +
                 std::to_string(s.steps) + ")";
        next[t].push_back(std::move(s.file));
      }
    }
    resume_ = std::move(next);
    resume_whole_ = std::move(whole);
    resume_checkpoint_ = std::move(fall_back);
    // Requests due by the furthest step any trainer held (a membership ends for ranks to join
    // where one of them reached the boundary).
    std::uint64_t furthest = 0;
    for (int r : survivors)
      for (const auto& t : left_[static_cast<std::size_t>(r)]) furthest = std::max(furthest, t.steps);
    carried.joined = 0;
    std::erase_if(joins_, [&](const join_request& j) { return j.at <= furthest && (carried.joined += j.ranks, true); });
    begun_.reset();  // the next membership may go on from an earlier step (a sharded update's checkpoint)
    regrouped_at_.reset();
    const std::size_t next_world = survivors.size() + static_cast<std::size_t>(carried.joined);
    left_.assign(next_world, {});
    next_index_.assign(next_world, 0);
    accounted_.assign(next_world, 0);
    ++restarts_;
    return std::nullopt;
  }
 private:
  void account(int rank) {
    {
      std::lock_guard lock(mutex_);
      ++accounted_.at(static_cast<std::size_t>(rank));
    }
    if (listener_.accounted) listener_.accounted(rank);
  }

  struct join_request {
    std::uint64_t at;  // steps completed when they join
    int ranks;
  };
  struct world_limit {
    int most;
    std::string why;
  };

  mutable std::mutex mutex_;
  std::vector<join_request> joins_;
  std::optional<world_limit> limit_;  // the most ranks a trainer of the run can hold
  std::optional<std::uint64_t> begun_;  // the most steps completed that a trainer began a step with
  std::optional<std::chrono::steady_clock::time_point> regrouped_at_;
  std::vector<std::vector<left_state>> left_;  // [rank][trainer]
  std::vector<std::size_t> next_index_;        // [rank]
  std::vector<std::size_t> accounted_;         // [rank]: trainers that left their state or ended
  listener listener_;
  bool encode_ = false;
  std::vector<std::vector<std::any>> resume_;  // [trainer][new rank]
  std::vector<bool> resume_whole_;                               // [trainer]
  std::vector<std::optional<saved_checkpoint>> resume_checkpoint_;  // [trainer]
  int restarts_ = 0;
};

// A communicator's view of the hand-over: its own rank's part (no hand-over: elastic training is off).
class rank_handoff {
 public:
  rank_handoff() = default;
  rank_handoff(handoff* h, int rank) : handoff_(h), rank_(rank) {}
  explicit operator bool() const noexcept { return handoff_ != nullptr; }
  handoff& shared() const noexcept { return *handoff_; }
  int rank() const noexcept { return rank_; }

 private:
  handoff* handoff_ = nullptr;
  int rank_ = 0;
};

}  // namespace ddp::elastic
