// ddp-bench invariance: the example's model (784-h-h-10 with batch norm) trained K steps on
// Fashion-MNIST under reduction::invariant<8> at every world size of a list, replicated and
// sharded, with SGD-momentum and AdamW; each run's hash of parameters and buffers (FNV-1a over
// their bytes) is printed, and the exit status is 1 unless every world size of a set-up gives
// one hash. Every step is 8 virtual shards of --global-batch / 8 samples, dealt by
// trainer.epoch_shards(). --reduction plain deals the same shards as micro-batches under the
// plain reduction: its hashes differ between world sizes (the check can fail).
//
// In-process ranks by default; --backend mpi runs the world that mpirun started (one hash per
// set-up, compared with --expect when given).
//
// --lose R@S: each in-process run with more than one rank runs under inproc::launch_elastic, and
// rank R throws in its last micro-batch of step S; the ranks that remain go on from step S
// (docs/elastic.md). The hash must still be the uninterrupted runs'; the table adds the new world
// size, the time from the throw to the new membership's start (handover_ms: the survivors unwind
// and hand over their state) and to the first step the remaining ranks complete (recovery_ms).
// --rejoin K: a rank joins them again K steps later (elastic_control::grow); the table adds the
// world size then and the time from that step boundary to the first step the larger world
// completes (rejoin_ms).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp_bench/commands.hpp"
#include "ddp/data/fashion_mnist.hpp"
#include "ddp/data/loader.hpp"
#include "ddp/ddp.hpp"
#include "ddp/inproc/elastic.hpp"
#include "ddp/inproc/launch.hpp"
#include "model.hpp"
#if DDP_BENCH_WITH_MPI
#include "ddp/mpi/communicator.hpp"
#include "ddp/mpi/environment.hpp"
#endif

namespace bench {
namespace invariance_detail {

using ddp::data::fashion_mnist;
constexpr std::size_t shards = 8;
using loader_t = ddp::data::loader<fashion_mnist, decltype(&fashion_mnist::collate)>;

std::uint64_t fnv1a(std::uint64_t h, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::string hex(std::uint64_t h) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// The parameters' and buffers' bytes, hashed in the module's order.
std::uint64_t state_hash(fmnist::model& m) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (auto& p : m.parameters()) h = fnv1a(h, p.value.data, p.value.bytes());
  for (auto& b : m.buffers()) h = fnv1a(h, b.value.data, b.value.bytes());
  return h;
}

// This rank's shards of each step of one epoch, as trainer.epoch_shards() deals them; for the
// plain reduction, which has no epoch_shards(), the same dealing by hand.
template <class Trainer>
auto epoch_steps(Trainer& t, loader_t& loader, std::uint64_t seed, std::uint64_t epoch) {
  if constexpr (Trainer::reduction_policy::virtual_shards != 0) {
    return t.epoch_shards(loader);
  } else {
    const auto mine = ddp::sampler::virtual_shards(shards, t.communicator().rank(), t.communicator().size());
    std::vector<decltype(loader.batches(ddp::shard{}))> streams;
    for (std::size_t s = mine.first; s < mine.last; ++s)
      streams.push_back(loader.batches(ddp::sampler::make_shard<typename Trainer::sampler_policy>(
          loader.dataset_size(), static_cast<int>(s), static_cast<int>(shards), seed, epoch)));
    return ddp::data::shard_steps(std::move(streams));
  }
}

// --lose: where a rank throws, and when the ranks that remain completed their first step.
struct lost_rank {
  int rank = -1;
  std::uint64_t step = 0;
  std::uint64_t rejoin = 0;  // steps after the loss at which a rank joins again (0: never)
  using clock = std::chrono::steady_clock;
  std::atomic<clock::rep> thrown_at{0}, first_step_after{0}, boundary_at{0}, first_step_rejoined{0};
  static std::chrono::microseconds between(clock::rep from, clock::rep to) {
    return std::chrono::duration_cast<std::chrono::microseconds>(clock::duration(to - from));
  }
  std::chrono::microseconds recovery() const { return between(thrown_at, first_step_after); }
  std::chrono::microseconds rejoining() const { return between(boundary_at, first_step_rejoined); }
};

// Which membership of an elastic run this rank is in (0: the first, or not elastic).
template <class Comm>
int membership_of(const Comm& comm) {
  if constexpr (requires { comm.handoff(); }) {
    const auto h = comm.handoff();
    return h ? h.shared().restarts() : 0;
  } else {
    return 0;
  }
}

// One rank's run: `steps` steps from the example's initial weights; the hash of the result. The
// loop goes on from the trainer's epoch and step, as a run that resumes does.
template <class Reduction, class Update, class Optimizer, class Comm>
std::uint64_t train_rank(Comm& comm, const invariance_params& p, const fashion_mnist& data, Optimizer opt,
                         lost_rank* lose) {
  auto model = fmnist::make_model(1, p.hidden);
  ddp::host::device dev;
  ddp::trainer<fmnist::model, Reduction, Update, Optimizer, ddp::use_communicator<Comm>> t(model, comm, dev, opt);
  loader_t loader(data, p.global_batch / shards, &fashion_mnist::collate);
  const int membership = membership_of(comm);
  bool first_step = true;
  while (t.steps() < static_cast<std::uint64_t>(p.steps)) {
    for (const auto& step : epoch_steps(t, loader, 0, t.epochs_started())) {
      std::size_t micro = 0;
      // The boundary where the lost rank joins again: this step ends the membership instead.
      if (lose && lose->rejoin && membership == 1 && comm.rank() == 0 && t.steps() == lose->step + lose->rejoin)
        lose->boundary_at = lost_rank::clock::now().time_since_epoch().count();
      t.step(step, [&](auto& r, const auto& b) {
        if (lose && membership == 0 && comm.rank() == lose->rank && t.steps() == lose->step && ++micro == step.size()) {
          lose->thrown_at = lost_rank::clock::now().time_since_epoch().count();
          throw std::runtime_error("rank " + std::to_string(lose->rank) + " lost at step " + std::to_string(lose->step) +
                                   " (ddp-bench invariance --lose)");
        }
        r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y, b.weights).grad);
      });
      if (lose && membership > 0 && first_step && comm.rank() == 0)
        (membership == 1 ? lose->first_step_after : lose->first_step_rejoined) =
            lost_rank::clock::now().time_since_epoch().count();
      first_step = false;
      if (t.steps() == static_cast<std::uint64_t>(p.steps)) break;
    }
  }
  return state_hash(model);
}

struct setup {
  std::string update, optimizer;
};

// Every rank's hash of one set-up on `comm`'s world (they must agree within it too).
template <class Reduction, class Comm>
std::uint64_t run_setup(Comm& comm, const invariance_params& p, const fashion_mnist& data, const setup& s,
                        lost_rank* lose) {
  const ddp::optim::sgd sgd{.lr = 0.05f, .momentum = 0.9f};
  const ddp::optim::adamw adamw{.lr = 1e-3f, .weight_decay = 1e-2f};
  if (s.update == "sharded")
    return s.optimizer == "adamw" ? train_rank<Reduction, ddp::update::sharded>(comm, p, data, adamw, lose)
                                  : train_rank<Reduction, ddp::update::sharded>(comm, p, data, sgd, lose);
  return s.optimizer == "adamw" ? train_rank<Reduction, ddp::update::replicated>(comm, p, data, adamw, lose)
                                : train_rank<Reduction, ddp::update::replicated>(comm, p, data, sgd, lose);
}

template <class Comm>
std::uint64_t run_any(Comm& comm, const invariance_params& p, const fashion_mnist& data, const setup& s,
                      lost_rank* lose = nullptr) {
  if (p.reduction == "plain") return run_setup<ddp::reduction::plain>(comm, p, data, s, lose);
  return run_setup<ddp::reduction::invariant<shards>>(comm, p, data, s, lose);
}

// "R@S" -> rank R, step S.
void parse_lose(const std::string& text, lost_rank& out) {
  const auto at = text.find('@');
  try {
    if (at == std::string::npos) throw std::invalid_argument("no @");
    std::size_t used = 0;
    out.rank = std::stoi(text.substr(0, at), &used);
    if (used != at) throw std::invalid_argument("rank");
    out.step = std::stoull(text.substr(at + 1), &used);
    if (used != text.size() - at - 1) throw std::invalid_argument("step");
  } catch (const std::exception&) {
    throw std::invalid_argument("--lose '" + text + "': write RANK@STEP, e.g. 1@20 (rank 1 throws in step 20)");
  }
}

std::vector<column> lose_columns(bool rejoin) {
  std::vector<column> c{{"ranks", 6}, {"backend", 8}, {"update", 11}, {"optimizer", 10}, {"lost", 8},
                        {"then", 5}, {"handover_ms", 12}, {"recovery_ms", 12}};
  if (rejoin) c.insert(c.end(), {{"back", 5}, {"rejoin_ms", 10}});
  c.insert(c.end(), {{"hash", 17}, {"same", 5}});
  return c;
}

std::vector<setup> setups(const invariance_params& p) {
  std::vector<setup> all;
  for (const auto& u : p.updates)
    for (const auto& o : p.optimizers) all.push_back({u, o});
  return all;
}

}  // namespace invariance_detail

int run_invariance(const invariance_params& p) {
  using namespace invariance_detail;
  if (p.global_batch % shards != 0)
    throw std::invalid_argument("--global-batch " + std::to_string(p.global_batch) + " does not cut into " +
                                std::to_string(shards) + " virtual shards: choose a multiple of " + std::to_string(shards));
  const std::string dir = p.data_dir.empty() ? std::string(fashion_mnist::default_directory) : p.data_dir;
  lost_rank lose;
  if (!p.lose.empty()) {
    parse_lose(p.lose, lose);
    if (p.reduction != "invariant" || p.backend != "inproc")
      throw std::invalid_argument("--lose runs in-process ranks under the invariant reduction (--backend inproc "
                                  "--reduction invariant): the hash then shows that no step was lost or repeated");
    for (const auto& u : p.updates)
      if (u != "replicated")
        throw std::invalid_argument("--lose needs --update replicated: under update::sharded the lost rank's shard of "
                                    "the optimizer state goes with it (docs/elastic.md)");
    if (lose.step >= static_cast<std::uint64_t>(p.steps))
      throw std::invalid_argument("--lose " + p.lose + ": the run has only " + std::to_string(p.steps) + " steps");
    if (lose.rank < 0 || std::none_of(p.ranks.begin(), p.ranks.end(), [&](int w) { return lose.rank < w && w > 1; }))
      throw std::invalid_argument("--lose " + p.lose + ": no world of --ranks has a rank " + std::to_string(lose.rank) +
                                  " to lose and others to go on");
    lose.rejoin = static_cast<std::uint64_t>(p.rejoin);
    if (lose.rejoin && lose.step + lose.rejoin >= static_cast<std::uint64_t>(p.steps))
      throw std::invalid_argument("--rejoin " + std::to_string(p.rejoin) + ": step " +
                                  std::to_string(lose.step + lose.rejoin) + " is past the run's " +
                                  std::to_string(p.steps) + " steps");
  } else if (p.rejoin) {
    throw std::invalid_argument("--rejoin needs --lose: the rank that joins again is the one lost");
  }
  const auto data = fashion_mnist::load(fashion_mnist::split::train, dir);
  report out("invariance",
             "parameters and buffers after " + std::to_string(p.steps) + " steps of the example's model (hidden " +
                 std::to_string(p.hidden) + ", global batch " + std::to_string(p.global_batch) + " as " +
                 std::to_string(shards) + " virtual shards), reduction " + p.reduction,
             p.lose.empty() ? std::vector<column>{{"ranks", 6}, {"backend", 8}, {"update", 11}, {"optimizer", 10},
                                                  {"hash", 17}, {"same", 5}}
                            : lose_columns(p.rejoin != 0));
  std::map<std::string, std::string> first;  // per set-up: the first world size's hash
  bool all_agree = true, lead = true;
  // --lose: the lost rank, the world size that went on and the recovery time of the last run.
  std::vector<cell> lost_cells;
  auto record = [&](int world, const char* backend, const setup& s, const std::vector<std::uint64_t>& hashes) {
    bool agree = true;
    for (auto h : hashes) agree = agree && h == hashes[0];  // the ranks of one run
    const std::string key = s.update + "/" + s.optimizer;
    const std::string h = hex(hashes[0]);
    std::string expected = first.count(key) ? first[key] : (p.expect.empty() ? h : p.expect);
    if (!first.count(key)) first[key] = expected;
    agree = agree && h == expected;
    all_agree = all_agree && agree;
    std::vector<cell> row{static_cast<long long>(world), std::string(backend), s.update, s.optimizer};
    row.insert(row.end(), lost_cells.begin(), lost_cells.end());
    row.push_back(agree ? h : h + (hashes.size() > 1 && hashes[1] != hashes[0] ? " (ranks differ)" : ""));
    row.push_back(std::string(agree ? "yes" : "NO"));
    out.add(std::move(row));
  };
  if (p.backend == "mpi") {
#if DDP_BENCH_WITH_MPI
    if (!ddp::mpi::placement_from_environment())
      throw std::invalid_argument("--backend mpi runs one rank per process: start it with mpirun -np N");
    ddp::mpi::environment env;
    ddp::mpi::communicator comm;
    lead = comm.rank() == 0;
    out.begin(lead);
    for (const auto& s : setups(p)) {
      const std::uint64_t mine = run_any(comm, p, data, s);
      // Every rank's hash, to rank 0's table (an all_gather of one integer).
      std::vector<std::int64_t> all(static_cast<std::size_t>(comm.size()));
      const std::int64_t as_int = static_cast<std::int64_t>(mine);
      comm.all_gather(ddp::const_buffer{&as_int, 1, ddp::dtype::i64}, ddp::mutable_buffer{all.data(), all.size(), ddp::dtype::i64}).wait();
      std::vector<std::uint64_t> hashes(all.begin(), all.end());
      record(comm.size(), "mpi", s, hashes);
    }
#else
    throw std::invalid_argument("--backend mpi: this ddp-bench was built without MPI");
#endif
  } else {
    out.begin(true);
    for (const auto& s : setups(p))
      for (int world : p.ranks) {
        if (world < 1 || static_cast<std::size_t>(world) > shards)
          throw std::invalid_argument("--ranks " + std::to_string(world) + ": 1 to " + std::to_string(shards) +
                                      " ranks hold the " + std::to_string(shards) + " virtual shards");
        if (p.lose.empty()) {
          const auto hashes =
              ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) { return run_any(comm, p, data, s); });
          record(world, "inproc", s, hashes);
        } else if (world == 1 || lose.rank >= world) {  // nothing to lose: the uninterrupted run
          const auto hashes =
              ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) { return run_any(comm, p, data, s); });
          lost_cells.assign(lose.rejoin ? 6 : 4, std::string("-"));
          record(world, "inproc", s, hashes);
        } else {
          std::vector<std::uint64_t> hashes;
          std::mutex m;
          lose.thrown_at = 0, lose.first_step_after = 0, lose.boundary_at = 0, lose.first_step_rejoined = 0;
          ddp::inproc::elastic_control control;
          if (lose.rejoin) control.grow(1, lose.step + lose.rejoin);
          const auto elastic = ddp::inproc::launch_elastic(
              world,
              [&](ddp::inproc::communicator& comm) {
                const auto h = run_any(comm, p, data, s, &lose);
                std::lock_guard lock(m);
                hashes.resize(static_cast<std::size_t>(comm.size()));
                hashes[static_cast<std::size_t>(comm.rank())] = h;
              },
              {.control = &control});
          auto ms = [](std::chrono::microseconds us) {
            char text[32];
            std::snprintf(text, sizeof text, "%.1f", static_cast<double>(us.count()) / 1000.0);
            return std::string(text);
          };
          lost_cells = {std::to_string(lose.rank) + "@" + std::to_string(lose.step),
                        static_cast<long long>(elastic.changes.at(0).new_world), ms(elastic.changes.at(0).to_restart),
                        ms(lose.recovery())};
          if (lose.rejoin)
            lost_cells.insert(lost_cells.end(), {static_cast<long long>(elastic.world_size), ms(lose.rejoining())});
          record(world, "inproc", s, hashes);
        }
      }
  }
  out.note(all_agree ? "every world size gave one hash per set-up"
                     : p.expect.empty() ? "the hashes differ between world sizes"
                                        : "the hashes differ between world sizes or from --expect " + p.expect);
  if (lead) out.write(p.out);
  return all_agree ? 0 : 1;
}

}  // namespace bench
