#pragma once
// ddp::trainer<Module, Policies...>: N copies of a module on N ranks trained as one run on the
// global batch.
//
//   using trainer_t = ddp::trainer<my_model, ddp::buffer_sync::average_once_per_step,
//                                  ddp::unused_params::detect_each_step, ddp::optim::adamw>;
//   trainer_t trainer(model, comm, device, ddp::optim::adamw{.lr = 1e-3f});
//   trainer.step([&](auto& replica) {
//     auto out = replica.forward(x);
//     auto [loss, grad] = loss_fn(out, y);
//     replica.backward(grad);
//   });
//
// Policies go in any order; empty slots take defaults. Each slot's policy is a component with
// its own concept and code (ddp/policy/*.hpp, ddp/optim, ddp/sampler, ddp/policy/engine.hpp),
// and a user's type that models the concept fits the slot. The trainer owns the policies and
// derives from ddp::trainer_core<Module, Comm, Device> (trainer_core.hpp), the step's
// orchestration, which every trainer over the same module, communicator and device shares.
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <ranges>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/concepts/loader.hpp"
#include "ddp/data/shard_steps.hpp"
#include "ddp/optim/external.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/policy/bucket_cap.hpp"
#include "ddp/policy/buffer_sync.hpp"
#include "ddp/policy/comm_hook.hpp"
#include "ddp/policy/engine.hpp"
#include "ddp/policy/unused_params.hpp"
#include "ddp/policy/update.hpp"
#include "ddp/sampler/sampler.hpp"
#include "ddp/sampler/virtual_shards.hpp"
#include "ddp/trainer/handoff.hpp"
#include "ddp/trainer/checkpoint.hpp"
#include "ddp/trainer/epoch_position.hpp"
#include "ddp/trainer/parts.hpp"
#include "ddp/trainer/trainer_core.hpp"
#include "ddp/trainer/trainer_policies.hpp"

namespace ddp {

struct trainer_options {
  // Seeds the sampler's order; with the same seed every run visits the data identically.
  std::uint64_t seed = 0;
};

using detail::trainer_slots;

template <class Module, class... Policies>
class trainer : private detail::trainer_policies<Module, Policies...>::holder_base,
                public detail::trainer_policies<Module, Policies...>::core {
  using policies = detail::trainer_policies<Module, Policies...>;
  using holder = typename policies::holder_base;

 public:
  using core_type = typename policies::core;
  // The policy in each slot (listed, or the slot's default).
  template <class Slot>
  using policy_type = typename policies::template get<Slot>;
  using buffer_sync_policy = policy_type<buffer_sync::slot>;
  using unused_params_policy = policy_type<unused_params::slot>;
  using sampler_policy = policy_type<sampler::slot>;
  using bucket_policy = policy_type<buckets::slot>;
  using optimizer_type = policy_type<optim::slot>;
  using update_policy = policy_type<update::slot>;
  using comm_hook_policy = policy_type<comm_hook::slot>;
  using reduction_policy = policy_type<reduction::slot>;
  using sync_schedule_policy = policy_type<sync_schedule::slot>;
  using typename core_type::communicator_type;
  using typename core_type::device_type;

  trainer(Module& module, communicator_type& comm, device_type& dev, optimizer_type opt = {},
          trainer_options options = {})
      : holder(std::move(opt)), core_type(module, comm, dev, holder::parts()), position_(options.seed) {
    detail::agree_on_policies(this->communicator(), this->device(), core().observer(), static_cast<holder&>(*this));
    const ddp::comm::tag_scope tag(ddp::comm::purpose::handover);
    resume_handed_over();
  }
  // In an elastic run (inproc::launch_elastic), a trainer that an exception destroys leaves the
  // state of its last completed step for the ranks that go on.
  ~trainer() {
    if (handoff_.unwinding()) leave_state();
  }

  // Join (trainer_core::join) shadows the peers' reductions, which a schedule's local steps skip.
  std::size_t join() {
    static_assert(sync_schedule::syncs_every_step<sync_schedule_policy>(),
                  "ddp: join() shadows the other ranks' gradient reductions step by step, but this trainer's sync "
                  "schedule (sync_schedule::local_sgd, diloco, or one without `every_step_sync`) skips them on local "
                  "steps: use sync_schedule::every_step with join(), or give every rank the same number of batches "
                  "(ddp::data::loader's epochs do)");
    return core_type::join();
  }

  // The optimizer's hyper-parameters; changes apply from the next step (schedules).
  optimizer_type& optimizer() noexcept { return policy<optim::slot>(); }
  const optimizer_type& optimizer() const noexcept { return holder::template of<optim::slot>().policy; }
  // The policy object in `Slot` (a user policy's settings, a sampler's state); changes apply from
  // the next call. Engine slots name types and hold no object.
  template <class Slot>
  decltype(auto) policy() noexcept {
    constexpr bool listed = holder::template has<Slot>;
    static_assert(listed, "ddp: policy<Slot>(): no such slot in a trainer");
    if constexpr (listed) {
      constexpr bool holds = requires(typename policies::template holder_type<Slot>& h) { h.policy; };
      static_assert(holds, "ddp: policy<Slot>(): this slot holds no policy object (the engine slots name a type)");
      if constexpr (holds) return (holder::template of<Slot>().policy);
    }
  }
  // This rank's share of the next epoch (its indices, and which are padding); the trainer
  // advances the epoch itself, so no epoch repeats the last one's order.
  shard next_epoch_shard(std::size_t dataset_size) {
    const auto& comm = this->communicator();
    return sampler::make_shard(current_sampler(), dataset_size, comm.rank(), comm.size(), position_.seed(),
                               position_.next_epoch());
  }
  std::vector<std::size_t> next_epoch_indices(std::size_t dataset_size) {
    return next_epoch_shard(dataset_size).indices;
  }
  // Batches of a loader for the next epoch (a loader that shuffles on its own cannot be
  // combined with a distributed sampler, which already shuffles per epoch).
  template <class Loader>
  auto epoch(Loader& loader) {
    if constexpr (diagnose_loader<Loader>()) return epoch_checked(loader);
  }
  // Under reduction::invariant<V>: the steps of the next epoch, each this rank's virtual shards of
  // it in shard order (sampler::virtual_shards; data/shard_steps.hpp). The sampler deals the data
  // set to V virtual ranks as it would to V ranks, so shard s of step t is the same samples at
  // every world size, and a loader of batch size B / V makes steps of B samples, padding weighing
  // nothing. Run a step with step(shards, f).
  template <class Loader>
  auto epoch_shards(Loader& loader) {
    constexpr std::size_t shards = reduction_policy::virtual_shards;
    static_assert(shards != 0, "ddp: epoch_shards() deals a step's virtual shards, which reduction::invariant<V> "
                               "has; under the plain reduction use epoch(loader)");
    static_assert(loader_requirements::has_shard_batches<Loader>,
                  "ddp: epoch_shards() needs a loader with batches(ddp::shard) (ddp::data::loader has it)");
    const auto& comm = this->communicator();
    std::size_t batch_size = 0;
    if constexpr (requires { loader.batch_size(); }) batch_size = loader.batch_size();
    position_.check_shard_batches(batch_size, comm.rank());  // refused before anything changes
    const auto mine = sampler::virtual_shards(shards, comm.rank(), comm.size());
    std::vector<decltype(loader.batches(std::declval<shard>()))> streams;
    for (std::size_t s = mine.first; s < mine.last; ++s)
      streams.push_back(loader.batches(sampler::make_shard(current_sampler(), loader.dataset_size(), static_cast<int>(s),
                                                           static_cast<int>(shards), position_.seed(),
                                                           position_.epochs_started())));
    position_.next_epoch();
    position_.start(batch_size);
    position_.started(/*shard_steps=*/true, /*recut=*/false, this->counts(), streams.front().size());
    if (const auto skip = position_.take_skip())  // the steps taken before the checkpoint, at any world size
      for (auto& stream : streams) detail::skip_taken(stream, static_cast<std::size_t>(*skip), comm.rank());
    return data::shard_steps(std::move(streams));
  }
  // One step of epoch_shards(): f(replica, batch) for each of this rank's shards, in shard order,
  // as micro-batches: accumulate() for all but the last, step() for it.
  template <class Shards, class F>
    requires requires(const Shards& s) { s.size(); s[0]; }
  void step(const Shards& shards, F&& f) {
    if (shards.size() == 0)
      throw error("trainer", "step", this->communicator().rank(),
                  "step(shards, f) with no shard: every rank holds one virtual shard at least in every step");
    for (std::size_t k = 0; k < shards.size(); ++k) {
      auto one = [&](auto& replica) { f(replica, shards[k]); };
      if (k + 1 < shards.size()) this->accumulate(one);
      else core_type::step(one);
    }
  }
  using core_type::step;
  std::uint64_t epochs_started() const noexcept { return position_.epochs_started(); }
  // Steps this rank takes per epoch with ddp::data::loader, equal on every rank (a short last
  // batch counts when the sampler visits every sample); under reduction::invariant<V>, steps of
  // epoch_shards() with shard batches of `batch`.
  std::size_t steps_per_epoch(std::size_t dataset_size, std::size_t batch) const {
    constexpr std::size_t shards = reduction_policy::virtual_shards;
    const int world = shards ? static_cast<int>(shards) : this->communicator().size();
    return sampler::batches_per_epoch(current_sampler(), dataset_size, world, batch);
  }

  // Checkpoints: everything this run needs to continue, bitwise as if it had not stopped:
  // parameters, buffers, optimizer state and update counts, the step count, the sampler's seed
  // and epoch, and the batches of the current epoch already taken. Every rank writes its own file
  // (under update::sharded, its shard of the optimizer state) into dir/step-N/; dir/LATEST
  // commits the checkpoint once every file is on disk; then the checkpoints `options` does not
  // keep go (by default all but this one: save_options keeps the last k, every n steps, the best
  // k by a metric). A crash at any point leaves the previous checkpoints whole. Collective;
  // between steps; the same options on every rank. `dir` must be one directory every rank can
  // reach (a shared file system across hosts). The optimizer's hyper-parameters, parameter groups
  // and clipping are the program's: set them as before.
  void save(const std::filesystem::path& dir, const save_options& options = {}) {
    detail::save_checkpoint(core(), dir, position(), options);
    last_checkpoint_ = elastic::saved_checkpoint{dir.string(), this->steps()};
  }
  // Loads the checkpoint committed last in `dir`, or with `steps` the committed one saved at that
  // step count (ddp::committed_checkpoints lists them). The next epoch(loader) continues the
  // epoch it was saved in, after the batches already taken (at the same world size), or starts
  // the next one.
  // Another model, bucket plan, optimizer or policy list, a truncated or corrupt file, or a
  // mid-epoch checkpoint at another world size is an error on every rank naming the file and what
  // differs, and changes nothing. At another world size the optimizer state's shards are re-cut.
  // Collective; between steps.
  void load(const std::filesystem::path& dir) { load_at(dir, std::nullopt); }
  void load(const std::filesystem::path& dir, std::uint64_t steps) { load_at(dir, steps); }

  // "slot=name, ..." of the policy types.
  static std::string describe_policies() { return holder::describe_types(); }
  // The same, with choices made at run time (the hook a comm_hook::one_of selected).
  std::string describe() const { return holder::describe(/*checkpoint=*/false); }

 private:
  static constexpr bool sampler_recuts = sampler::recuts_epochs<sampler_policy>;

  void load_at(const std::filesystem::path& dir, std::optional<std::uint64_t> steps) {
    continue_from(detail::load_checkpoint(core(), dir, position(), sampler_recuts, steps));
    last_checkpoint_ = elastic::saved_checkpoint{dir.string(), this->steps()};
  }
  void continue_from(const detail::run_position& saved) {
    position_.continue_from(saved, this->communicator().size(), this->counts());
  }

  // ---- elastic runs (trainer/handoff.hpp) ----------------------------------------------------

  void resume_handed_over() {
    handoff_.watch_steps(core().observer(), this->communicator(), this->device(), reduction_policy::virtual_shards);
    if (const auto c = handoff_.resume_checkpoint()) return load_at(c->dir, c->steps);  // a sharded update
    const auto* handed = handoff_.resume_files();
    if (!handed) return;
    const auto& comm = this->communicator();
    std::vector<detail::checkpoint_file> files;
    std::optional<std::string> problem;
    try {
      files = detail::handed_over_files(*handed, handoff_.resume_whole(), comm.rank(), comm.size());
    } catch (const std::exception& e) {
      problem = detail::problem_text(e);
    }
    const auto rank = static_cast<std::size_t>(comm.rank());
    const std::size_t own = files.size() == 1 || rank >= files.size() ? 0 : rank;
    continue_from(detail::load_files(core(), files, own, position(), sampler_recuts, problem,
                                     "the state the ranks that remain handed over"));
    if (rank >= handed->size()) core().checkpoint_state("join").start_from_anchor();  // a rank that joins
  }
  void leave_state() noexcept {
    std::any state;  // none when it cannot be written (a step failed after its update began): the
    try {            // step count and the last checkpoint still go, for a sharded update's fall-back
      detail::checkpoint_file f;
      position_at(position_.completed_count(this->counts())).write(f, this->communicator().rank());
      core().handover_state().write(f);
      state = handoff_.encodes_states() ? std::any(elastic::encoded_state{f.encode(), {}}) : std::any(std::move(f));
    } catch (...) {
    }
    try {
      handoff_.leave(std::move(state), !update::gathers_parameters<update_policy>(), this->steps(), last_checkpoint_);
    } catch (...) {  // nothing handed over: the launcher says the state of this rank is unknown
    }
  }

  core_type& core() noexcept { return *this; }
  const sampler_policy& current_sampler() const noexcept { return holder::template of<sampler::slot>().policy; }

  // A checkpoint must match every slot but the communicator (a run saved in-process may go on
  // under mpirun).
  std::string checkpoint_policies() const { return holder::describe(/*checkpoint=*/true); }
  // Where the run is in its epoch (trainer/epoch_position.hpp): micro-batches taken, or under
  // reduction::invariant steps of epoch_shards(), which are the same at every world size (a
  // checkpoint saved in the middle of an epoch then resumes at another).
  detail::run_position position() const { return position_at(position_.count(this->counts())); }
  detail::run_position position_at(std::uint64_t count) const {
    return position_.at(count, checkpoint_policies(), this->communicator().size());
  }

  template <class Loader>
  auto epoch_checked(Loader& loader) {
    static_assert(!(Loader::shuffles_itself && sampler_policy::is_distributed),
                  "ddp: this loader shuffles on its own, but the trainer's distributed sampler "
                  "already orders the data per epoch (pitfall P4); use a loader without a "
                  "shuffle of its own (ddp::data::loader<Dataset, Collate>), or sampler::contiguous");
    std::size_t batch_size = 0;
    if constexpr (requires { loader.batch_size(); }) batch_size = loader.batch_size();
    const auto recut = position_.recut(requires { loader.batch_size(); } ? std::optional(batch_size) : std::nullopt);
    constexpr bool can_recut =
        sampler_recuts && loader_requirements::has_shard_batches<Loader> && requires { loader.batch_size(); };
    if (recut && !can_recut)  // refused before anything changes: the checkpoint's position stays loaded
      throw error("trainer", "epoch", this->communicator().rank(),
                  "the checkpoint's epoch was taken at another world size or batch size, so its rest is re-cut, "
                  "which needs a sampler with remaining_indices() (sampler::distributed) and a loader with "
                  "batches(ddp::shard) and batch_size() (ddp::data::loader has them); or resume at the world size "
                  "and batch size it was saved with");
    position_.start(batch_size);
    auto batches = [&] {
      if constexpr (loader_requirements::has_shard_batches<Loader>) {
        if constexpr (can_recut)
          if (recut) return loader.batches(rest_of_epoch_shard(loader, *recut));
        return loader.batches(next_epoch_shard(loader.dataset_size()));
      } else {
        return loader.batches(next_epoch_indices(loader.dataset_size()));
      }
    }();
    std::optional<std::size_t> length;
    if constexpr (std::ranges::sized_range<decltype(batches)>) length = std::ranges::size(batches);
    position_.started(/*shard_steps=*/false, recut.has_value(), this->counts(), length);
    if (!recut && position_.empty())  // every rank alike: the sampler deals evenly
      throw error("trainer", "epoch", this->communicator().rank(),
                  "the epoch makes no batch: a data set of " + std::to_string(loader.dataset_size()) +
                      " samples dealt to " + std::to_string(this->communicator().size()) + " ranks" +
                      (position_.batch_size() ? " in batches of " + std::to_string(position_.batch_size())
                                              : std::string()) +
                      " leaves each rank no whole batch: use a smaller batch, fewer ranks, or a sampler that pads "
                      "(sampler::distributed<true, tail::pad>, the default); an empty data set cannot train");
    if (const auto skip = position_.take_skip())  // a checkpoint's epoch: its first batches were taken before
      detail::skip_taken(batches, static_cast<std::size_t>(*skip), this->communicator().rank());
    return batches;
  }
  // This rank's share of the rest of the interrupted epoch.
  template <class Loader>
  shard rest_of_epoch_shard(const Loader& loader, const detail::epoch_cut& taken) {
    const auto& comm = this->communicator();
    const std::uint64_t offset = position_.recut_offset(taken, loader.batch_size());
    return sampler::remaining_shard(current_sampler(), loader.dataset_size(), offset, comm.rank(), comm.size(),
                                    position_.seed(), position_.next_epoch());
  }

  detail::epoch_position position_;  // the seed, the epoch, how far it went
  detail::trainer_handoff<communicator_type> handoff_{this->communicator()};
  std::optional<elastic::saved_checkpoint> last_checkpoint_;  // saved or loaded last: a sharded update's fallback
};

}  // namespace ddp
