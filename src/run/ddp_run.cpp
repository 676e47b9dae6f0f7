// ddp-run: starts N worker processes of an MPI training program (through mpirun on this host, or
// srun under Slurm), watches them, and when one dies, lets the others leave the state of their
// last completed step and starts the program again on the ranks that remain (or on a spare
// slot), from that state. docs/elastic.md ("Processes") says what survives what.
//
//   ddp-run -n 4 [--max-restarts 3] [--min-world 1] [--spares 0] [--state DIR] [--report FILE]
//           [--launcher mpirun|srun] [--launcher-args "..."] -- program [args...]
//
// The workers reach ddp-run over one TCP connection each (ddp/comm/run_channel.hpp): ddp-run hears
// of a death as the connection closes, at once, and tells the others; a worker's MPI
// environment and communicators do the rest (ddp/comm/run_agent.hpp). The launcher's own wire-up
// (mpirun's, or Slurm's PMIx) starts each membership; ddp-run needs no rendezvous of its own.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/comm/run_channel.hpp"

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

struct settings {
  int nproc = 0;
  int max_restarts = 3;
  int min_world = 1;
  int spares = 0;
  std::string state;
  std::string report;
  std::string launcher;
  std::string launcher_args;
  std::string host;
  double leave_timeout = 30;
  double error_grace = 0.5;  // how long a rank's own error waits for the others' before they are told
  double stall_grace = 3;    // how long after a rank's timeout the others' timeouts are waited for
  double start_timeout = 120;
  double kill_every = 0;  // fault injection: SIGKILL a random worker this often (seconds)
  unsigned kill_seed = 1;
  int kill_count = -1;  // at most this many (-1: no bound)
  std::vector<std::string> program;
};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "ddp-run: %s\n", what.c_str());
  std::exit(1);
}

void say(const std::string& what) {
  std::fprintf(stderr, "ddp-run: %s\n", what.c_str());
  std::fflush(stderr);
}

// One state a worker's trainer left: a file of its last completed step.
struct left_state {
  std::uint64_t steps = 0;
  bool whole = false;
  std::string file;
  std::optional<std::pair<std::uint64_t, std::string>> checkpoint;  // steps, dir
};

struct worker {
  ddp::run::channel conn;
  int rank = -1;
  pid_t pid = 0;
  bool saved = false, bye = false, failed = false, gone = false;
  bool own_error = false;  // it said it failed (not a peer's failure)
  bool stalled = false;    // a collective of it waited past its timeout for a peer
  bool stateless = false;  // it ended without a state to leave
  std::map<std::size_t, left_state> left;
};

// A membership change, as logged and reported.
struct restart {
  int failed_rank = -1;
  std::string cause;
  std::uint64_t steps = 0, resumed_at = 0;
  int old_world = 0, new_world = 0;
  std::optional<double> recovery_s;  // from the failure to the first step after it
};

class listener {
 public:
  // Only this host's workers (mpirun here) reach a listener on the loopback interface.
  explicit listener(bool loopback) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) fail(std::string("socket: ") + std::strerror(errno));
    const int on = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(loopback ? INADDR_LOOPBACK : INADDR_ANY);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 256) != 0)
      fail(std::string("cannot listen for workers: ") + std::strerror(errno));
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~listener() { ::close(fd_); }
  int fd() const { return fd_; }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

pid_t start_launcher(const settings& s, int world, int membership, const std::string& address,
                     const fs::path& state_dir, const std::string& resume) {
  std::vector<std::string> argv;
  if (s.launcher == "srun") {
    argv = {"srun", "-n", std::to_string(world), "--kill-on-bad-exit=0"};
  } else {
    argv = {"mpirun"};
    if (::geteuid() == 0) argv.push_back("--allow-run-as-root");
    // A rank that dies does not make mpirun stop the others: they leave their state and end on
    // their own, and mpirun with them.
    argv.insert(argv.end(), {"--enable-recovery", "-np", std::to_string(world)});
  }
  std::istringstream extra(s.launcher_args);
  for (std::string a; extra >> a;) argv.push_back(a);
  argv.insert(argv.end(), s.program.begin(), s.program.end());
  const pid_t pid = ::fork();
  if (pid < 0) fail(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);  // the launcher and its workers: one group ddp-run can stop
    ::setenv(ddp::run::address_variable, address.c_str(), 1);
    ::setenv(ddp::run::state_variable, state_dir.c_str(), 1);
    ::setenv(ddp::run::membership_variable, std::to_string(membership).c_str(), 1);
    if (resume.empty()) ::unsetenv(ddp::run::resume_variable);
    else ::setenv(ddp::run::resume_variable, resume.c_str(), 1);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "ddp-run: cannot start %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  return pid;
}

// Waits `grace` seconds for the launcher to end, then stops it and every process it started
// (SIGTERM, and SIGKILL 2 s later); returns its wait status.
int stop_group(pid_t pid, double grace) {
  int status = 0;
  auto wait_for = [&](double seconds) {
    for (int i = 0; i <= static_cast<int>(seconds * 100); ++i) {
      if (::waitpid(pid, &status, WNOHANG) == pid) return true;
      ::usleep(10000);
    }
    return false;
  };
  if (wait_for(grace)) return status;
  ::kill(-pid, SIGTERM);
  if (wait_for(2)) return status;
  ::kill(-pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return status;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + ::strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

void write_report(const settings& s, const std::vector<restart>& restarts, int final_world, int faults_injected,
                  const std::string& outcome) {
  if (s.report.empty()) return;
  std::ofstream out(s.report);
  out << "{\"outcome\": \"" << json_escape(outcome) << "\", \"world\": " << final_world
      << ", \"faults_injected\": " << faults_injected << ", \"restarts\": [";
  for (std::size_t i = 0; i < restarts.size(); ++i) {
    const auto& r = restarts[i];
    out << (i ? ", " : "") << "{\"failed_rank\": " << r.failed_rank << ", \"cause\": \"" << json_escape(r.cause)
        << "\", \"steps\": " << r.steps << ", \"resumed_at\": " << r.resumed_at << ", \"old_world\": " << r.old_world
        << ", \"new_world\": " << r.new_world << ", \"recovery_s\": ";
    if (r.recovery_s) out << *r.recovery_s;
    else out << "null";
    out << "}";
  }
  out << "]}\n";
}

// Per trainer (by build order), the state a rank of the next membership starts from.
using trainer_states = std::map<std::size_t, left_state>;

// What the next membership starts from, written as the manifest its workers read (`next`
// returns it); or why the run cannot go on. Each survivor offers, per trainer, the state it left,
// else the one its membership started from (it failed before that trainer completed a step
// here), else a fresh start.
std::optional<std::string> carry_over(const std::vector<const trainer_states*>& survivors, const trainer_states& started,
                                      const fs::path& manifest, trainer_states& next, restart& r) {
  std::size_t trainers = started.empty() ? 0 : started.rbegin()->first + 1;
  for (const auto* w : survivors)
    if (!w->empty()) trainers = std::max(trainers, w->rbegin()->first + 1);
  std::ofstream out(manifest);
  next.clear();
  r.resumed_at = r.steps = 0;
  for (std::size_t t = 0; t < trainers; ++t) {
    std::vector<const left_state*> offers;  // null: a fresh start
    for (const auto* w : survivors)
      offers.push_back(w->contains(t) ? &w->at(t) : started.contains(t) ? &started.at(t) : nullptr);
    const bool sharded = std::any_of(offers.begin(), offers.end(), [](const left_state* o) { return o && !o->whole; });
    if (!sharded) {
      // Each holds the whole state; a survivor that completed one more step than another (the
      // dead rank's last reduction reached it) holds a valid later state: every rank starts from it.
      const left_state* best = nullptr;
      for (const auto* o : offers)
        if (o && (!best || o->steps > best->steps)) best = o;
      if (!best) continue;  // a fresh start
      out << ddp::run::join({std::to_string(t), "file", std::to_string(best->steps), best->file}) << '\n';
      next[t] = *best;
      if (t == 0) r.steps = r.resumed_at = best->steps;
      continue;
    }
    const auto& first = offers.front();
    for (const auto* o : offers)
      if (!o || !o->checkpoint || !first->checkpoint || o->checkpoint != first->checkpoint)
        return "trainer " + std::to_string(t) +
               " has a sharded update: the optimizer state's shard of each failed rank went with it, and there is no "
               "checkpoint that every rank saved or loaded to go back to. Save checkpoints (trainer.save) for the run "
               "to fall back to the last one, or use update::replicated to go on from the last completed step";
    out << ddp::run::join({std::to_string(t), "checkpoint", std::to_string(first->checkpoint->first),
                           first->checkpoint->second})
        << '\n';
    next[t] = *first;
    if (t == 0) r.steps = first->steps, r.resumed_at = first->checkpoint->first;
  }
  if (!out) return "cannot write " + manifest.string();
  return std::nullopt;
}

int run(const settings& s) {
  const bool remote_workers = !s.host.empty() || s.launcher == "srun";
  listener lis(!remote_workers);
  const std::string host = !s.host.empty() ? s.host : s.launcher == "srun" ? [] {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    return std::string(name);
  }() : "127.0.0.1";
  const std::string address = host + ":" + std::to_string(lis.port());
  const bool own_state = s.state.empty();
  const fs::path state = own_state ? fs::temp_directory_path() / ("ddp-run-" + std::to_string(::getpid())) : fs::path(s.state);
  fs::create_directories(state);

  std::vector<restart> restarts;
  std::mt19937 rng(s.kill_seed);
  int faults = 0, spares = s.spares, world = s.nproc;
  std::string resume;
  trainer_states started;  // what this membership started from
  const trainer_states none;
  std::optional<clock_type::time_point> recovering_since;
  for (int membership = 0;; ++membership) {
    const fs::path dir = state / ("membership-" + std::to_string(membership));
    fs::create_directories(dir);
    const pid_t launcher = start_launcher(s, world, membership, address, dir, resume);
    std::vector<worker> workers;
    std::optional<clock_type::time_point> failed_at;
    int origin = -1;
    std::string cause;
    // When the others are told of the failure: at once for a death; for a rank's own error, after
    // --error-grace, so that ranks raising the same error a moment later report it as their own
    // (every rank failing alike ends the run at once instead of losing a rank each restart).
    std::optional<clock_type::time_point> tell_at;
    bool told = false;
    // A rank whose collective timed out waited for a peer: once the others that wait have timed
    // out too, the ranks that reported nothing are the ones that stopped making progress.
    std::optional<clock_type::time_point> stalled_since;
    std::string stall;
    std::optional<int> launcher_status;
    bool progress = false;  // a step completed in this membership
    const auto membership_start = clock_type::now();
    auto next_kill = clock_type::time_point::max();

    auto tell_peers = [&] {
      if (told) return;
      told = true;
      for (auto& o : workers)
        if (o.rank != origin && o.conn && !o.gone && !o.own_error)
          o.conn.send(ddp::run::join({"peer_failed", std::to_string(origin), cause}));
    };
    auto on_failure = [&](worker& w, const std::string& why, bool own) {
      w.failed = true;
      if (!own) tell_at = clock_type::now();  // a death: the others wait for it in a collective
      if (failed_at && !own && !told && origin != w.rank) {
        // A death within --error-grace of the errors reported so far explains them: a collective
        // with a dead peer may fail inside MPI before ddp-run sees the connection close. The dead
        // rank is the one lost; the ranks that reported those errors go on.
        for (auto& o : workers) o.own_error = false;
        origin = w.rank, cause = why;
        say("rank " + std::to_string(w.rank) + " of " + std::to_string(world) + " failed: " + why +
            " (the errors reported just before it are taken as its consequences)");
        return;
      }
      if (failed_at) return;
      failed_at = clock_type::now();
      origin = w.rank, cause = why;
      say("rank " + std::to_string(w.rank) + " of " + std::to_string(world) + " failed: " + why);
      if (!tell_at)
        tell_at = *failed_at + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(s.error_grace));
    };
    auto on_line = [&](worker& w, const std::string& line) {
      const auto f = ddp::run::fields(line);
      if (f[0] == "hello" && f.size() >= 5) {
        if (std::stoi(f[4]) != membership || std::stoi(f[2]) != world) {  // a straggler of an earlier one
          w.conn.close();
          w.gone = true;
          return;
        }
        w.rank = std::stoi(f[1]);
        w.pid = static_cast<pid_t>(std::stol(f[3]));
        if (told)  // a peer failed before this one connected
          w.conn.send(ddp::run::join({"peer_failed", std::to_string(origin), cause}));
      } else if (f[0] == "left" && f.size() >= 7) {
        left_state l{std::stoull(f[2]), f[3] == "1", f[4], std::nullopt};
        if (!f[5].empty()) l.checkpoint = std::make_pair(std::stoull(f[5]), f[6]);
        w.left[std::stoul(f[1])] = l;
      } else if (f[0] == "saved" || f[0] == "nostate") {
        w.saved = true;
        w.stateless = f[0] == "nostate";
      } else if (f[0] == "stalled" && f.size() >= 2) {
        w.stalled = true;
        if (!stalled_since) stalled_since = clock_type::now(), stall = f[1];
      } else if (f[0] == "failed" && f.size() >= 2) {
        w.own_error = true;
        on_failure(w, f[1], true);
      } else if (f[0] == "step" && !progress) {  // the membership's first step: faults may come now
        progress = true;
        next_kill = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                            std::chrono::duration<double>(s.kill_every > 0 ? s.kill_every : 1e9));
        if (!recovering_since) return;
        const double s_ = std::chrono::duration<double>(clock_type::now() - *recovering_since).count();
        restarts.back().recovery_s = s_;
        recovering_since.reset();
        char buf[160];
        std::snprintf(buf, sizeof buf, "the first step after restart %zu completed %.3f s after the failure (step %s)",
                      restarts.size(), s_, f.size() > 1 ? f[1].c_str() : "?");
        say(buf);
      } else if (f[0] == "bye") {
        w.bye = true;
      }
    };

    // Until the launcher ends, or a failure's survivors have all left their state.
    for (;;) {
      std::vector<pollfd> fds{{lis.fd(), POLLIN, 0}};
      for (auto& w : workers) fds.push_back({w.conn ? w.conn.fd() : -1, POLLIN, 0});
      ::poll(fds.data(), fds.size(), 20);
      if (fds[0].revents & POLLIN) {
        const int fd = ::accept4(lis.fd(), nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) workers.emplace_back().conn = ddp::run::channel(fd);
      }
      for (std::size_t i = 1; i < fds.size(); ++i) {
        auto& w = workers[i - 1];
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR)) || !w.conn) continue;
        const bool open = w.conn.receive();
        while (auto line = w.conn.next_line()) on_line(w, *line);
        if (!open) {
          w.conn.close();
          w.gone = true;
          // A connection that closes before it said which rank it is was no worker of this run.
          if (w.rank >= 0 && !w.saved && !w.bye && !w.failed)
            on_failure(w, "its process ended without a word (killed by a signal such as SIGKILL, or crashed)", false);
        }
      }
      if (!launcher_status) {
        int status = 0;
        if (::waitpid(launcher, &status, WNOHANG) == launcher) launcher_status = status;
      }
      const auto started_since = std::chrono::duration<double>(clock_type::now() - membership_start).count();
      const auto connected = std::count_if(workers.begin(), workers.end(), [](const worker& w) { return w.rank >= 0; });
      if (!failed_at && connected < world && started_since > s.start_timeout) {
        say("only " + std::to_string(connected) + " of " + std::to_string(world) + " ranks connected within " +
            std::to_string(static_cast<int>(s.start_timeout)) + " s (--start-timeout): a rank did not start "
            "(see the launcher's output above), or cannot reach ddp-run at " + address + " (--host)");
        stop_group(launcher, 0);
        write_report(s, restarts, world, faults, "ranks did not start");
        return 1;
      }
      if (stalled_since && !failed_at &&
          clock_type::now() - *stalled_since >= std::chrono::duration_cast<clock_type::duration>(
                                                     std::chrono::duration<double>(s.stall_grace))) {
        std::vector<worker*> waited, silent;
        for (auto& w : workers)
          if (w.stalled) waited.push_back(&w);
          else if (w.rank >= 0 && !w.gone && !w.saved && !w.bye) silent.push_back(&w);
        if (silent.empty()) {  // every rank waited: none is told apart, each failed alike
          for (auto* w : waited) w->own_error = true;
          if (!waited.empty()) on_failure(*waited.front(), "its collective made no progress: " + stall, true);
          stalled_since.reset();
        } else {
          std::sort(waited.begin(), waited.end(), [](const worker* a, const worker* b) { return a->rank < b->rank; });
          std::string ranks;
          for (auto* w : waited) ranks += (ranks.empty() ? "" : ", ") + std::to_string(w->rank);
          for (auto* w : silent) {
            w->own_error = true;  // lost: it is stopped, and the run goes on without it
            on_failure(*w, "it stopped making progress: rank(s) " + ranks + " waited for it past their timeout (" +
                               stall + ")", false);
            if (w->pid > 0) ::kill(w->pid, SIGKILL);
          }
        }
      }
      if (failed_at && !told) {
        const auto own = std::count_if(workers.begin(), workers.end(), [](const worker& w) { return w.own_error; });
        if (own == world) told = true;  // every rank failed on its own: nobody is left to tell
        else if (clock_type::now() >= *tell_at) tell_peers();
      }
      if (failed_at) {
        const bool all_left = std::all_of(workers.begin(), workers.end(), [](const worker& w) {
          return w.rank < 0 || w.saved || w.gone;
        });
        const double waited = std::chrono::duration<double>(clock_type::now() - *failed_at).count();
        if (all_left || waited > s.leave_timeout || launcher_status) break;
      } else if (launcher_status) {
        break;
      }
      if (s.kill_every > 0 && !failed_at && clock_type::now() >= next_kill && faults != s.kill_count) {
        std::vector<worker*> live;
        bool ending = false;
        for (auto& w : workers) {
          if (w.pid > 0 && !w.gone && !w.bye) live.push_back(&w);
          ending = ending || w.bye;
        }
        if (ending) live.clear();  // the run is finishing
        if (static_cast<int>(live.size()) == world && world > s.min_world) {
          worker* victim = live[std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng)];
          say("injected fault " + std::to_string(++faults) + ": SIGKILL to rank " + std::to_string(victim->rank) +
              " (pid " + std::to_string(victim->pid) + ")");
          ::kill(victim->pid, SIGKILL);
        }
        next_kill = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                            std::chrono::duration<double>(s.kill_every));
      }
    }
    // After a failure every worker has left its state, or will not: the launcher ends with them.
    const int status = launcher_status ? *launcher_status : stop_group(launcher, 5.0);
    if (!failed_at) {
      const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
                         std::all_of(workers.begin(), workers.end(), [](const worker& w) { return w.bye; });
      if (clean) {
        say("finished on " + std::to_string(world) + " ranks after " + std::to_string(restarts.size()) + " restart(s)" +
            (faults ? ", " + std::to_string(faults) + " injected fault(s)" : ""));
        write_report(s, restarts, world, faults, "finished");
        if (own_state) fs::remove_all(state);
        return 0;
      }
      const std::string why = "the workers ended (" + describe_status(status) +
                              ") without a failure ddp-run can go on from (every rank raised the same error, or the "
                              "job was aborted): see their output above";
      say(why);
      write_report(s, restarts, world, faults, why);
      return WIFEXITED(status) && WEXITSTATUS(status) ? WEXITSTATUS(status) : 1;
    }
    // A rank survives when it left its state (or ended without one to leave) and did not fail on
    // its own; the others are lost: the one that failed first, any that died or never reported.
    restart r{origin, cause, 0, 0, world, 0, std::nullopt};
    auto end_run = [&](const std::string& why) {
      say("cannot go on: " + why);
      write_report(s, restarts, world, faults, "cannot go on: " + why);
      return 1;
    };
    const auto own_failures = std::count_if(workers.begin(), workers.end(), [](const worker& w) { return w.own_error; });
    if (own_failures == world)
      return end_run("every rank failed (" + cause + "): no rank was lost to go on without; see their output above");
    std::vector<const trainer_states*> survivors;
    bool any_state = false;
    for (const auto& w : workers)
      if (w.rank >= 0 && w.saved && !w.own_error) {
        survivors.push_back(&w.left);
        any_state = any_state || !w.left.empty();
      }
    if (survivors.empty()) return end_run("no rank survived the failure (" + cause + ")");
    if (progress && !any_state)
      return end_run("the ranks completed steps in this membership but none left its state (is its communicator "
                     "one that hands over, ddp::mpi::communicator?); going on would silently repeat them");
    const int lost = world - static_cast<int>(survivors.size());
    if (static_cast<int>(restarts.size()) >= s.max_restarts)
      return end_run("the run already restarted " + std::to_string(restarts.size()) + " time(s) (--max-restarts " +
                     std::to_string(s.max_restarts) + ")");
    const fs::path manifest = dir / "resume";
    trainer_states next;
    if (const auto why = carry_over(survivors, started, manifest, next, r)) return end_run(*why);
    const int replaced = std::min(spares, lost);
    spares -= replaced;
    r.new_world = world - lost + replaced;
    if (r.new_world < s.min_world)
      return end_run(std::to_string(r.new_world) + " rank(s) remain, fewer than --min-world " +
                     std::to_string(s.min_world));
    restarts.push_back(r);
    say("restart " + std::to_string(restarts.size()) + " of at most " + std::to_string(s.max_restarts) + ": lost " +
        (lost == 1 ? "rank " + std::to_string(origin) : std::to_string(lost) + " ranks (rank " + std::to_string(origin) +
                                                             " first)") + " after " + std::to_string(r.steps) + " completed steps; " + std::to_string(world) + " -> " +
        std::to_string(r.new_world) + " ranks" + (replaced ? " (" + std::to_string(replaced) + " on spare slots)" : "") +
        ", going on from step " + std::to_string(r.resumed_at) + (r.resumed_at != r.steps ? " (a sharded update's last checkpoint)" : ""));
    recovering_since = *failed_at;
    world = r.new_world;
    resume = next.empty() ? std::string() : manifest.string();
    started = std::move(next);
  }
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  CLI::App app{"ddp-run: starts an MPI training program on N processes and, when one dies, goes on with the others "
               "from the last completed step (docs/elastic.md)"};
  app.add_option("-n,--nproc", s.nproc, "worker processes (ranks) to start")->required()->check(CLI::PositiveNumber);
  app.add_option("--max-restarts", s.max_restarts, "membership changes before the run gives up")->capture_default_str();
  app.add_option("--min-world", s.min_world, "fewest ranks the run goes on with")->capture_default_str();
  app.add_option("--spares", s.spares, "spare slots: a lost rank is replaced (the world keeps its size) while they last")
      ->capture_default_str();
  app.add_option("--state", s.state, "directory for the states survivors leave (default: a fresh one under $TMPDIR, "
                                     "removed when the run finishes)");
  app.add_option("--report", s.report, "write the run's restarts here as JSON");
  app.add_option("--launcher", s.launcher, "mpirun, or srun (the default inside a Slurm allocation)")
      ->check(CLI::IsMember({"mpirun", "srun"}));
  app.add_option("--launcher-args", s.launcher_args, "extra arguments for the launcher, e.g. \"--oversubscribe\"");
  app.add_option("--host", s.host, "the address workers reach ddp-run at (default: 127.0.0.1; under srun, this host's name)");
  app.add_option("--leave-timeout", s.leave_timeout, "seconds the survivors get to leave their state")->capture_default_str();
  app.add_option("--stall-grace", s.stall_grace,
                 "seconds after a rank's collective timed out that the other ranks get to time out too; the ranks "
                 "that did not are the ones that stopped making progress, and the run goes on without them")
      ->capture_default_str();
  app.add_option("--error-grace", s.error_grace,
                 "seconds a rank's own error waits for the other ranks' before they are told of it (ranks that "
                 "raise the same error within it end the run at once, as one error)")
      ->capture_default_str();
  app.add_option("--start-timeout", s.start_timeout, "seconds every rank of a membership gets to connect")
      ->capture_default_str();
  app.add_option("--kill-every", s.kill_every, "fault injection: SIGKILL a random rank every this many seconds");
  app.add_option("--kill-seed", s.kill_seed, "seed of --kill-every's choice of rank")->capture_default_str();
  app.add_option("--kill-count", s.kill_count, "--kill-every injects at most this many faults");
  app.add_option("program", s.program, "the training program and its arguments (after --)")->required();
  CLI11_PARSE(app, argc, argv);
  if (s.launcher.empty()) s.launcher = std::getenv("SLURM_JOB_ID") ? "srun" : "mpirun";
  if (s.min_world > s.nproc) fail("--min-world " + std::to_string(s.min_world) + " exceeds -n " + std::to_string(s.nproc));
  if (s.kill_every > 0 && s.launcher != "mpirun")
    fail("--kill-every kills workers by their process id on this host: it needs --launcher mpirun");
  ::signal(SIGPIPE, SIG_IGN);
  return run(s);
}
