#pragma once
// Saving and loading a whole run (ddp::trainer::save / load): the core's state (parameters,
// buffers, optimizer state, counts; trainer/state_io.hpp) and the trainer's position (the
// sampler's seed and epoch, the batches already taken in it), every rank's file in one step
// directory, committed by LATEST once every rank's file is on disk (checkpoint_file.hpp); the
// checkpoints the save's options do not keep (checkpoint_retention.hpp) go after the commit.
// Written once for every trainer over the same core, whatever the policies.
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/core/error.hpp"
#include "ddp/trainer/checkpoint_file.hpp"
#include "ddp/trainer/checkpoint_retention.hpp"
#include "ddp/trainer/consensus.hpp"
#include "ddp/trainer/parameters_gathered.hpp"
#include "ddp/trainer/signature.hpp"

namespace ddp::detail {

// A checkpoint's epoch resumed: the first `n` batches of this rank's range were taken before it
// was saved.
template <class Range>
void skip_taken(Range& batches, std::size_t n, int rank) {
  if constexpr (requires { batches.skip(n); }) {
    batches.skip(n);
  } else if constexpr (requires { batches.erase(batches.begin(), batches.begin() + 1); }) {
    batches.erase(batches.begin(), batches.begin() + static_cast<std::ptrdiff_t>(std::min(n, batches.size())));
  } else {
    throw error("trainer", "epoch", rank,
                "resuming in the middle of an epoch skips the " + std::to_string(n) +
                    " batches taken before the checkpoint, but this loader's range can do neither skip(n) nor "
                    "erase: return a ddp::data::batch_stream or a std::vector, or save at the end of an epoch");
  }
}

// What the trainer, not the core, knows of the run.
struct run_position {
  std::string policies;  // "slot=name, ..." of every slot but the communicator
  std::uint64_t seed = 0;
  std::uint64_t epochs_started = 0;
  std::uint64_t batches_in_epoch = 0;  // of the epoch started last, already taken
  bool epoch_finished = true;          // every batch of that epoch taken (or none started)
  bool in_shard_steps = false;         // the epoch came from epoch_shards(): batches_in_epoch counts its steps,
                                       // which are the same at every world size
  int world = 0;                       // the world size batches_in_epoch were taken at
  std::uint64_t order_offset = 0;      // positions of the epoch's order taken before those batches (an epoch
                                       // re-cut for another world size: sampler::remaining_shard)
  std::uint64_t batch_size = 0;        // the loader's, for those batches (0: not known)

  // Writes the position into a rank's checkpoint file.
  void write(checkpoint_file& f, int rank) const {
    f.set_text("format", "1");
    f.set_text("world", std::to_string(world));
    f.set_text("rank", std::to_string(rank));
    f.set_text("policies", policies);
    f.set_text("seed", std::to_string(seed));
    f.set_text("epochs_started", std::to_string(epochs_started));
    f.set_text("batches_in_epoch", std::to_string(batches_in_epoch));
    f.set_text("epoch_finished", epoch_finished ? "1" : "0");
    f.set_text("epoch_in_shard_steps", in_shard_steps ? "1" : "0");
    f.set_text("epoch_order_offset", std::to_string(order_offset));
    f.set_text("epoch_batch_size", std::to_string(batch_size));
  }
  static run_position read(const checkpoint_file& f) {
    run_position p;
    p.policies = f.text("policies");
    p.seed = f.number("seed");
    p.epochs_started = f.number("epochs_started");
    p.batches_in_epoch = f.number("batches_in_epoch");
    p.epoch_finished = f.text("epoch_finished") == "1";
    p.in_shard_steps = f.has("meta/epoch_in_shard_steps") && f.text("epoch_in_shard_steps") == "1";
    p.world = static_cast<int>(f.number("world"));
    p.order_offset = f.has("meta/epoch_order_offset") ? f.number("epoch_order_offset") : 0;
    p.batch_size = f.has("meta/epoch_batch_size") ? f.number("epoch_batch_size") : 0;
    return p;
  }

  // The first slot whose policy differs, "" when none. The text is "slot=name, slot=name" in slot
  // order; a name may hold ", " inside parentheses (distributed(shuffle, pad)), and a slot whose
  // policy goes unnamed (the plain reduction) is left out of it.
  static std::string first_difference(const std::string& saved, const std::string& here) {
    using entry = std::pair<std::string, std::string>;  // slot, name
    auto slots = [](const std::string& s) {
      std::vector<entry> out;
      std::size_t start = 0;
      int depth = 0;
      for (std::size_t i = 0; i <= s.size(); ++i) {
        if (i < s.size() && s[i] == '(') ++depth;
        if (i < s.size() && s[i] == ')') --depth;
        if (i < s.size() && !(depth == 0 && s.compare(i, 2, ", ") == 0)) continue;
        const std::string part = s.substr(start, i - start);
        const auto eq = part.find('=');
        if (!part.empty()) out.emplace_back(part.substr(0, eq), eq == std::string::npos ? "" : part.substr(eq + 1));
        start = i + 2;
      }
      return out;
    };
    const auto a = slots(saved), b = slots(here);
    auto named = [](const std::vector<entry>& list, const std::string& slot) -> std::string {
      for (const auto& [s, name] : list)
        if (s == slot) return slot + "=" + name;
      return "the default " + slot;
    };
    for (const auto* list : {&a, &b})
      for (const auto& e : *list)
        if (const auto x = named(a, e.first), y = named(b, e.first); x != y)
          return "the checkpoint has " + x + ", this trainer " + y;
    return "";
  }
};

// This rank's problem when its save options differ from rank 0's ("" when they agree). Collective.
template <communicator C, device D>
std::string save_options_disagreement(C& comm, D& dev, const save_options& o) {
  using bits = std::int64_t;  // the communicators' widest integer; the options' values as bit patterns
  const std::array<bits, 6> mine{std::bit_cast<bits>(std::uint64_t{o.keep_last}), std::bit_cast<bits>(o.keep_every_steps),
                                 std::bit_cast<bits>(std::uint64_t{o.keep_best}), o.lower_is_better, o.metric.has_value(),
                                 std::bit_cast<bits>(o.metric.value_or(0.0))};
  const auto all = comm::host_all_gather(comm, dev, std::span<const bits>(mine));
  if (std::equal(mine.begin(), mine.end(), all.begin())) return "";
  save_options first;
  first.keep_last = static_cast<std::size_t>(std::bit_cast<std::uint64_t>(all[0]));
  first.keep_every_steps = std::bit_cast<std::uint64_t>(all[1]);
  first.keep_best = static_cast<std::size_t>(std::bit_cast<std::uint64_t>(all[2]));
  first.lower_is_better = all[3] != 0;
  if (all[4]) first.metric = std::bit_cast<double>(all[5]);
  return "its save options (" + describe(o) + ") differ from rank 0's (" + describe(first) +
         "): pass the same on every rank (a metric reduced over the ranks: trainer.evaluate or trainer.reduce)";
}

template <class Core>
void save_checkpoint(Core& core, const std::filesystem::path& dir, const run_position& pos,
                     const save_options& options) {
  const comm::tag_scope tag(comm::purpose::checkpoint_agreement);
  auto& comm = core.communicator();
  auto& dev = core.device();
  const checkpoint_directory where{dir};
  const std::string step = checkpoint_directory::step_name(core.steps());
  std::optional<std::string> problem;
  std::vector<checkpoint_info> committed;  // rank 0: the directory's index before this save
  // Every rank compares first (a collective), so options that differ stop every rank alike,
  // before any writes.
  const std::string not_written =
      "the checkpoint in '" + dir.string() + "' was not written (the one before it, if any, is intact)";
  if (auto differs = save_options_disagreement(comm, dev, options); !differs.empty()) problem = differs;
  else if (auto why = save_options_problem(options); !why.empty()) problem = why;
  agree_or_throw(comm, dev, problem, "save", not_written);
  try {
      auto state = core.checkpoint_state("save");
      const detail::parameters_gathered whole(state.reducer.parameters());  // first: a collective, on every rank alike
      if (comm.rank() == 0) committed = where.index();
      checkpoint_file f;
      pos.write(f, comm.rank());
      state.write(f);
      std::filesystem::create_directories(dir / step);
      write_file_atomically(where.rank_file(step, comm.rank(), comm.size()), f.encode(), comm.rank());
    } catch (const std::exception& e) {
      problem = problem_text(e);
    }
  agree_or_throw(comm, dev, problem, "save", not_written);
  // Every rank's file is on disk: commit, then drop the step directories the options do not keep
  // (and any a save that died left behind).
  problem.reset();
  if (comm.rank() == 0) try {
      std::erase_if(committed, [&](const checkpoint_info& c) { return c.steps == core.steps(); });
      committed.push_back({core.steps(), comm.size(), options.metric});
      const auto kept = retained(committed, options);
      const std::string index = checkpoint_directory::index_text(kept);
      write_file_atomically(where.latest(), std::span(reinterpret_cast<const std::uint8_t*>(index.data()), index.size()),
                            0);
      std::vector<std::string> names;
      for (const auto& c : kept) names.push_back(checkpoint_directory::step_name(c.steps));
      for (const auto& e : std::filesystem::directory_iterator(dir)) {
        const auto name = e.path().filename().string();
        if (e.is_directory() && name.rfind("step-", 0) == 0 && std::find(names.begin(), names.end(), name) == names.end())
          std::filesystem::remove_all(e.path());
      }
    } catch (const std::exception& e) {
      problem = problem_text(e);
    }
  agree_or_throw(comm, dev, problem, "save", "the checkpoint in '" + dir.string() + "' was not committed");
}

// Checks that a checkpoint's `files` (every rank's at its world size, or only this rank's own)
// can be loaded into `core` (`here`: this trainer's position, `recuts`: its sampler can re-cut
// an epoch for another world size), then loads them on every rank, or throws on every rank
// (`where` names the checkpoint) and changes nothing. Returns the saved position.
template <class Core>
run_position load_files(Core& core, const std::vector<checkpoint_file>& files, std::size_t own,
                        const run_position& here, bool recuts, std::optional<std::string> problem,
                        const std::string& where) {
  auto& comm = core.communicator();
  run_position saved;
  if (!problem) try {
      const auto& f = files.at(own);
      if (f.text("format") != "1")
        throw error("trainer", "load", comm.rank(), "'" + f.path() + "' has format " + f.text("format") + "; this ddp reads 1");
      saved = run_position::read(f);
      if (const auto d = run_position::first_difference(saved.policies, here.policies); !d.empty())
        throw error("trainer", "load", comm.rank(),
                    "'" + f.path() + "' was written by a trainer with other policies: " + d +
                        "; build the trainer with the checkpoint's policies");
      if (saved.world != comm.size() && !saved.epoch_finished && !saved.in_shard_steps && !recuts)
        throw error("trainer", "load", comm.rank(),
                    "'" + f.path() + "' was saved in the middle of an epoch at world size " + std::to_string(saved.world) +
                        ", and this run has " + std::to_string(comm.size()) +
                        " ranks: the rest of that epoch's order is cut for the old world, and this trainer's sampler "
                        "cannot re-cut it (sampler::distributed can). Resume at world size " +
                        std::to_string(saved.world) + ", or save at the end of an epoch to change the world size");
      for (const auto& file : files)
        if (auto why = core.checkpoint_state("load").check(file)) throw error("trainer", "load", comm.rank(), *why);
    } catch (const std::exception& e) {
      problem = problem_text(e);
    }
  agree_or_throw(comm, core.device(), problem, "load", where + " cannot be loaded; the trainer is unchanged");
  core.checkpoint_state("load").read(files, own);
  return saved;
}

// What to load instead of `chosen`, a checkpoint of `committed` (dir's index) whose files cannot
// be used: the one committed before it, by its step, or that none is left.
inline std::string earlier_checkpoint(const std::filesystem::path& dir, const std::vector<checkpoint_info>& committed,
                                      std::vector<checkpoint_info>::const_iterator chosen) {
  if (chosen == committed.begin())
    return "no earlier checkpoint is left in '" + dir.string() + "' (its save_options kept only " +
           checkpoint_directory::step_name(chosen->steps) +
           "): restore the file, or start over; save_options::keep_last above 1 keeps one to fall back to";
  const auto before = std::prev(chosen)->steps;
  return "load the checkpoint committed before it, of step " + std::to_string(before) + " (trainer.load(dir, " +
         std::to_string(before) + "), '" + (dir / checkpoint_directory::step_name(before)).string() + "')";
}

// Loads the checkpoint committed in `dir` (the latest, or the one of step count `steps`) into
// `core`; returns the run's position there. Every check runs before anything changes: a
// checkpoint that cannot be loaded leaves the trainer as it was, with one error on every rank
// naming the file and what differs.
template <class Core>
run_position load_checkpoint(Core& core, const std::filesystem::path& dir, const run_position& here, bool recuts,
                             std::optional<std::uint64_t> steps = std::nullopt) {
  const comm::tag_scope tag(comm::purpose::checkpoint_agreement);
  auto& comm = core.communicator();
  std::optional<std::string> problem;
  std::vector<checkpoint_file> files;
  std::size_t own = 0;
  try {
    const checkpoint_directory where{dir};
    const auto committed = where.index();
    if (committed.empty())
      throw error("trainer", "load", comm.rank(),
                  "no checkpoint in '" + dir.string() + "' (no LATEST file; trainer.save(dir) writes one)");
    auto chosen = committed.end() - 1;
    if (steps) {
      chosen = std::find_if(committed.begin(), committed.end(), [&](const auto& c) { return c.steps == *steps; });
      if (chosen == committed.end()) {
        std::string listed;
        for (const auto& c : committed) listed += (listed.empty() ? "" : ", ") + std::to_string(c.steps);
        throw error("trainer", "load", comm.rank(),
                    "no checkpoint of step " + std::to_string(*steps) + " in '" + dir.string() +
                        "': its committed checkpoints are of steps " + listed +
                        " (ddp::committed_checkpoints(dir) lists them)");
      }
    }
    const std::string step = checkpoint_directory::step_name(chosen->steps);
    const int world = chosen->world;
    // The same world: this rank's own file. Another: every file (the optimizer state's shards are
    // re-cut), and rank r's buffers come from rank r, or rank 0 where the old world had no rank r.
    // A file that cannot be read or decoded (truncated, corrupt, missing): the fix is the
    // checkpoint committed before it, where retention kept one.
    auto read = [&](int rank) {
      const auto path = where.rank_file(step, rank, world);
      try {
        files.push_back(checkpoint_file::decode(read_whole_file(path), path.string()));
      } catch (const std::exception& e) {
        throw error("trainer", "load", comm.rank(), problem_text(e) + ": " + earlier_checkpoint(dir, committed, chosen));
      }
    };
    if (world == comm.size()) {
      read(comm.rank());
    } else {
      for (int r = 0; r < world; ++r) read(r);
      own = comm.rank() < world ? static_cast<std::size_t>(comm.rank()) : 0;
    }
  } catch (const std::exception& e) {
    problem = problem_text(e);
  }
  return load_files(core, files, own, here, recuts, problem, "the checkpoint in '" + dir.string() + "'");
}

}  // namespace ddp::detail

namespace ddp {

// Whether `dir` holds a committed checkpoint (trainer.load(dir) would find one).
inline bool has_checkpoint(const std::filesystem::path& dir) {
  return detail::checkpoint_directory{dir}.committed().has_value();
}

// The committed checkpoints in `dir`, oldest save first; the last is the one trainer.load(dir)
// reads. Empty when there is none.
inline std::vector<checkpoint_info> committed_checkpoints(const std::filesystem::path& dir) {
  return detail::checkpoint_directory{dir}.index();
}

}  // namespace ddp
