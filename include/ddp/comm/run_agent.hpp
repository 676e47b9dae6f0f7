#pragma once
// A worker's side of ddp-run (docs/elastic.md, "Processes"). Under ddp-run (DDP_RUN_ADDRESS set)
// the process has one agent: it tells ddp-run where the worker is, and when ddp-run says a peer
// died it fails this rank's communicators at once (a collective waiting for the dead peer would
// never return), so each trainer unwinds and leaves the state of its last completed step; the
// agent writes those states where ddp-run said, reports them, and ends the process. A worker of a
// later membership starts its trainers from the states ddp-run hands it.
//
// Nothing here runs in a step: the agent's thread waits on its connection.
#include <signal.h>
#include <unistd.h>

#include <any>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "ddp/comm/handoff.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/files.hpp"
#include "ddp/core/placement.hpp"
#include "ddp/comm/run_channel.hpp"

namespace ddp::run {

class agent {
 public:
  // This process's agent under ddp-run, or null. Made on first use; it lives as long as the process.
  static agent* current() {
    static agent* const the = make();
    return the;
  }

  int rank() const noexcept { return rank_; }
  int world() const noexcept { return world_; }
  int membership() const noexcept { return membership_; }
  elastic::rank_handoff handoff() noexcept { return {&handoff_, rank_}; }

  // `fail(origin, reason)` runs once, on the agent's thread, when a peer is gone (or this rank
  // gave up): a communicator breaks its queue there. Returns an id for forget().
  int on_failure(std::function<void(int origin, const std::string& reason)> fail) {
    std::lock_guard lock(mutex_);
    if (failed_) fail(failed_->first, failed_->second);  // a communicator made after the failure
    failures_[next_id_] = std::move(fail);
    return next_id_++;
  }
  void forget(int id) {
    std::lock_guard lock(mutex_);
    failures_.erase(id);
  }

  // This rank gave up (a communicator's abort): ddp-run hears it (every rank's own failure: when
  // all ranks failed alike there is no one to go on with) and tells the others; this rank's
  // communicators fail, and the process ends once its trainers are accounted for. A failure
  // already known here only adds the report.
  void report_failure(const std::string& reason) {
    if (known_failure()) return;  // a consequence: this rank's collectives failed with a failure known here
    send(join({"failed", reason}));
    if (!start_failing(rank_, "this rank failed: " + reason)) return;
    start_leaving();
  }
  // A collective of this rank waited past its timeout (a communicator's watchdog): ddp-run hears
  // that this rank stalled waiting for a peer, not that it failed. It tells apart the rank that
  // stopped making progress (the one that reported nothing) and goes on without that one; this
  // rank's communicators fail, and its trainers leave their state as after a peer's failure.
  void report_stall(const std::string& reason) {
    if (known_failure()) return;
    send(join({"stalled", reason}));
    if (!start_failing(rank_, "this rank waited past its timeout: " + reason)) return;
    start_leaving();
  }
  // The program ends by an exception (its MPI environment goes while unwinding): ddp-run hears of
  // it, and the process goes on ending by itself (the program's handler prints the error).
  void report_exit_by_exception() {
    if (!known_failure()) send(join({"failed", "the program ended by an exception (its output above says which)"}));
    start_failing(rank_, "this rank ended by an exception");
    exiting_.store(true);
  }
  // The program ended normally (its MPI environment is going).
  void finished() { send("bye"); }
  // Whether this rank's communicators were failed (MPI must not be finalised then).
  bool failing() const noexcept { return failing_.load(); }

 private:
  bool known_failure() {
    std::lock_guard lock(mutex_);
    return failed_.has_value();
  }

 public:

 private:
  static agent* make() {
    const char* address = std::getenv(address_variable);
    if (!address || !*address) return nullptr;
    return new agent(address);  // never destroyed: its thread may outlive main
  }

  explicit agent(const std::string& address)
      : rank_(placement_from_environment().value_or(placement{}).rank),
        world_(placement_from_environment().value_or(placement{}).size),
        membership_(env_int(membership_variable).value_or(0)),
        handoff_(world_) {
    if (!placement_from_environment())
      throw error("run", "agent", -1,
                  "DDP_RUN_ADDRESS is set but no launcher told this process its rank: ddp-run starts its workers "
                  "through mpirun or srun");
    if (const char* s = std::getenv(state_variable)) state_dir_ = s;
    handoff_.set_restarts(membership_);
    handoff_.encode_states();  // they go to disk
    if (const char* r = std::getenv(resume_variable); r && *r) read_resume(r);
    handoff_.listen({[this](int, std::size_t trainer, const elastic::left_state& s) { left(trainer, s); },
                     [this](int) { end_if_accounted(); },
                     [this](int, std::uint64_t steps) { send(join({"step", std::to_string(steps)})); }});
    conn_ = connect_to(address);
    send(join({"hello", std::to_string(rank_), std::to_string(world_), std::to_string(::getpid()),
               std::to_string(membership_)}));
    std::thread([this] { listen(); }).detach();
  }

  void send(const std::string& line) {
    std::lock_guard lock(send_mutex_);
    conn_.send(line);
  }

  // What the previous membership left: a line per trainer,
  //   <trainer> file <steps> <path>        the whole state of a replicated update
  //   <trainer> checkpoint <steps> <dir>   a sharded update's fall-back
  void read_resume(const std::string& manifest) {
    std::ifstream in(manifest);
    if (!in) throw error("run", "resume", rank_, "cannot read " + manifest + " (" + resume_variable + ")");
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const auto f = fields(line);
      if (f.size() != 4) throw error("run", "resume", rank_, manifest + ": malformed line '" + line + "'");
      const auto trainer = std::stoul(f[0]);
      if (f[1] == "checkpoint") {
        handoff_.resume_from(trainer, rank_, {}, elastic::saved_checkpoint{f[3], std::stoull(f[2])});
      } else {
        // The file's bytes as the trainer wrote them: it checks and decodes them itself.
        handoff_.resume_from(trainer, rank_,
                             elastic::encoded_state{detail::read_whole_file(f[3], "run", "resume", rank_), f[3]},
                             std::nullopt);
      }
    }
  }

  // On the trainer's thread, as it unwinds: its state goes to disk, and ddp-run hears where.
  void left(std::size_t trainer, const elastic::left_state& s) {
    const auto path = std::filesystem::path(state_dir_) /
                      ("rank-" + std::to_string(rank_) + "-trainer-" + std::to_string(trainer) + ".ddpckpt");
    try {
      std::filesystem::create_directories(path.parent_path());
      detail::write_file_atomically(path, std::any_cast<const elastic::encoded_state&>(s.file).bytes, rank_, "run",
                                    "leave");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ddp[run] rank %d could not write its state to %s: %s\n", rank_, path.c_str(), e.what());
      return;
    }
    send(join({"left", std::to_string(trainer), std::to_string(s.steps), s.whole ? "1" : "0", path.string(),
               s.checkpoint ? std::to_string(s.checkpoint->steps) : "", s.checkpoint ? s.checkpoint->dir : ""}));
    left_any_.store(true);
  }

  void listen() {
    for (;;) {
      while (auto line = conn_.next_line()) {
        const auto f = fields(*line);
        if (f[0] == "peer_failed" && f.size() >= 3 &&
            start_failing(std::stoi(f[1]), "rank " + f[1] + " failed (" + f[2] + ")", f[2]) && !exiting_.load())
          start_leaving();
      }
      if (!conn_.receive()) {
        std::fprintf(stderr, "ddp[run] rank %d: the connection to ddp-run closed; ending this worker\n", rank_);
        std::fflush(stderr);
        std::_Exit(1);
      }
    }
  }

  // The first failure known here (a peer's, or this rank's own) fails the communicators; false
  // for a later one. Under the lock: a communicator that forgets its action waits until it has
  // run, and one made later fails at once (on_failure).
  bool start_failing(int origin, const std::string& reason, const std::string& cause = {}) {
    std::lock_guard lock(mutex_);
    if (failed_) return false;
    failed_.emplace(origin, cause.empty() ? reason : cause);
    reason_ = reason;
    failing_.store(true);
    for (auto& [id, fail] : failures_) fail(failed_->first, failed_->second);
    return true;
  }

  // Once failing, the process ends as soon as every trainer built here left its state or ended
  // (on the thread of the last one, in its destructor): its communicators wait for a peer that
  // is gone and would never return, and the run goes on in the next membership.
  void end_if_accounted() {
    if (failing_.load() && !exiting_.load() && handoff_.all_accounted(rank_)) leave_now();
  }
  [[noreturn]] void leave_now() {
    std::lock_guard lock(leave_mutex_);  // once
    std::string reason;
    bool own = false;
    {
      std::lock_guard failure(mutex_);
      reason = reason_;
      own = failed_ && failed_->first == rank_;
    }
    const bool left = handoff_.all_accounted(rank_) && left_any_.load();
    // A rank that stalled waiting for a peer is no more at fault than one told of a peer's failure.
    own = own && reason.rfind("this rank waited past its timeout", 0) != 0;
    send(left ? "saved" : "nostate");
    std::fprintf(stderr, "ddp[run] rank %d: %s; %s\n", rank_, reason.c_str(),
                 left ? "it left the state of its last completed step for ddp-run"
                      : "it ends without a state to leave (no trainer held one)");
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(own ? 1 : 0);
  }
  // A rank with no trainer to wait for (or one that never unwinds: a thread stuck outside any
  // collective) ends after a while all the same.
  void start_leaving() {
    ::signal(SIGTERM, SIG_IGN);  // the launcher's stop of the job must not cut a state half written
    end_if_accounted();
    std::thread([this] {
      using namespace std::chrono;
      const auto limit = steady_clock::now() + milliseconds(env_int("DDP_RUN_LEAVE_MS").value_or(30000));
      while (!handoff_.all_accounted(rank_) && steady_clock::now() < limit) std::this_thread::sleep_for(milliseconds(2));
      leave_now();
    }).detach();
  }

  int rank_, world_, membership_;
  elastic::handoff handoff_;
  std::string state_dir_ = ".";
  channel conn_;
  std::mutex send_mutex_;
  std::mutex mutex_;
  std::map<int, std::function<void(int, const std::string&)>> failures_;
  int next_id_ = 0;
  std::atomic<bool> failing_{false};
  std::optional<std::pair<int, std::string>> failed_;  // the first failure known here: origin, cause (under mutex_)
  std::string reason_;                                   // what this rank prints as it ends (under mutex_)
  std::atomic<bool> left_any_{false};                    // a trainer's state went to disk
  std::atomic<bool> exiting_{false};                     // the program ends by itself (an exception)
  std::mutex leave_mutex_;
};

}  // namespace ddp::run
