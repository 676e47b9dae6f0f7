#pragma once
// Saving and loading a whole run (ddp::trainer::save / load): the core's state (parameters,
// buffers, optimizer state, counts; trainer/state_io.hpp) and the trainer's position (the
// sampler's seed and epoch, the batches already taken in it), every rank's file in one step
// directory, committed by LATEST once every rank's file is on disk (checkpoint_file.hpp).
// Written once for every trainer over the same core, whatever the policies.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ddp/trainer/checkpoint_file.hpp"
#include "ddp/trainer/consensus.hpp"
#include "ddp/trainer/signature.hpp"

namespace ddp::detail {

// What the trainer, not the core, knows of the run.
struct run_position {
  std::string policies;  // "slot=name, ..." of every slot but the communicator
  std::uint64_t seed = 0;
  std::uint64_t epochs_started = 0;
  std::uint64_t batches_in_epoch = 0;  // of the epoch started last, already taken
  bool epoch_finished = true;          // every batch of that epoch taken (or none started)

  // The first slot whose policy differs, "" when none.
  static std::string first_difference(const std::string& saved, const std::string& here) {
    auto slots = [](const std::string& s) {  // "slot=name, slot=name" -> each "slot=name"
      std::vector<std::string> parts;
      for (std::size_t at = 0;;) {
        const auto comma = s.find(", ", at);
        parts.push_back(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
        if (comma == std::string::npos) return parts;
        at = comma + 2;
      }
    };
    const auto d = detail::first_difference(slots(saved), slots(here));
    return d ? "the checkpoint has " + d->first + ", this trainer " + d->second : std::string();
  }
};

template <class Core>
void save_checkpoint(Core& core, const std::filesystem::path& dir, const run_position& pos) {
  auto& comm = core.communicator();
  auto& dev = core.device();
  const checkpoint_directory where{dir};
  const std::string step = checkpoint_directory::step_name(core.steps());
  std::optional<std::string> problem;
  try {
    checkpoint_file f;
    f.set_text("format", "1");
    f.set_text("world", std::to_string(comm.size()));
    f.set_text("rank", std::to_string(comm.rank()));
    f.set_text("policies", pos.policies);
    f.set_text("seed", std::to_string(pos.seed));
    f.set_text("epochs_started", std::to_string(pos.epochs_started));
    f.set_text("batches_in_epoch", std::to_string(pos.batches_in_epoch));
    f.set_text("epoch_finished", pos.epoch_finished ? "1" : "0");
    core.checkpoint_state("save").write(f);
    std::filesystem::create_directories(dir / step);
    write_file_atomically(where.rank_file(step, comm.rank(), comm.size()), f.encode(), comm.rank());
  } catch (const std::exception& e) {
    problem = e.what();
  }
  agree_or_throw(comm, dev, problem, "save",
                 "the checkpoint in '" + dir.string() + "' was not written (the one before it, if any, is intact)");
  // Every rank's file is on disk: commit, then drop the older step directories.
  problem.reset();
  if (comm.rank() == 0) try {
      const std::string index = step + " " + std::to_string(comm.size()) + "\n";
      write_file_atomically(where.latest(), std::span(reinterpret_cast<const std::uint8_t*>(index.data()), index.size()),
                            0);
      for (const auto& e : std::filesystem::directory_iterator(dir))
        if (e.is_directory() && e.path().filename().string().rfind("step-", 0) == 0 && e.path().filename() != step)
          std::filesystem::remove_all(e.path());
    } catch (const std::exception& e) {
      problem = e.what();
    }
  agree_or_throw(comm, dev, problem, "save", "the checkpoint in '" + dir.string() + "' was not committed");
}

// Loads the checkpoint committed in `dir` into `core`; returns the run's position there. Every
// check runs before anything changes: a checkpoint that cannot be loaded leaves the trainer as
// it was, with one error on every rank naming the file and what differs.
template <class Core>
run_position load_checkpoint(Core& core, const std::filesystem::path& dir, const run_position& here) {
  auto& comm = core.communicator();
  auto& dev = core.device();
  std::optional<std::string> problem;
  std::vector<checkpoint_file> files;
  std::size_t own = 0;
  run_position saved;
  try {
    const checkpoint_directory where{dir};
    const auto committed = where.committed();
    if (!committed)
      throw error("trainer", "load", comm.rank(),
                  "no checkpoint in '" + dir.string() + "' (no LATEST file; trainer.save(dir) writes one)");
    // Named copies, not structured bindings: a lambda below uses them (Clang before 16 cannot capture bindings).
    const std::string step = committed->first;
    const int world = committed->second;
    // The same world: this rank's own file. Another: every file (the optimizer state's shards are
    // re-cut), and rank r's buffers come from rank r, or rank 0 where the old world had no rank r.
    auto read = [&](int rank) {
      const auto path = where.rank_file(step, rank, world);
      files.push_back(checkpoint_file::decode(read_whole_file(path), path.string()));
    };
    if (world == comm.size()) {
      read(comm.rank());
    } else {
      for (int r = 0; r < world; ++r) read(r);
      own = comm.rank() < world ? static_cast<std::size_t>(comm.rank()) : 0;
    }
    const auto& f = files[own];
    if (f.text("format") != "1")
      throw error("trainer", "load", comm.rank(), "'" + f.path() + "' has format " + f.text("format") + "; this ddp reads 1");
    saved.policies = f.text("policies");
    saved.seed = f.number("seed");
    saved.epochs_started = f.number("epochs_started");
    saved.batches_in_epoch = f.number("batches_in_epoch");
    saved.epoch_finished = f.text("epoch_finished") == "1";
    if (const auto d = run_position::first_difference(saved.policies, here.policies); !d.empty())
      throw error("trainer", "load", comm.rank(),
                  "'" + f.path() + "' was written by a trainer with other policies: " + d +
                      "; build the trainer with the checkpoint's policies");
    if (world != comm.size() && !saved.epoch_finished)
      throw error("trainer", "load", comm.rank(),
                  "'" + f.path() + "' was saved in the middle of an epoch at world size " + std::to_string(world) +
                      ", and this run has " + std::to_string(comm.size()) +
                      " ranks: the rest of that epoch's order is cut for the old world. Resume at world size " +
                      std::to_string(world) + ", or save at the end of an epoch to change the world size");
    for (const auto& file : files)
      if (auto why = core.checkpoint_state("load").check(file)) throw error("trainer", "load", comm.rank(), *why);
  } catch (const std::exception& e) {
    problem = e.what();
  }
  agree_or_throw(comm, dev, problem, "load",
                 "the checkpoint in '" + dir.string() + "' cannot be loaded; the trainer is unchanged");
  core.checkpoint_state("load").read(files, own);
  return saved;
}

}  // namespace ddp::detail
