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
#include "ddp/optim/external.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/policy/bucket_cap.hpp"
#include "ddp/policy/buffer_sync.hpp"
#include "ddp/policy/comm_hook.hpp"
#include "ddp/policy/engine.hpp"
#include "ddp/policy/unused_params.hpp"
#include "ddp/policy/update.hpp"
#include "ddp/sampler/sampler.hpp"
#include "ddp/trainer/checkpoint.hpp"
#include "ddp/trainer/parts.hpp"
#include "ddp/trainer/trainer_core.hpp"

namespace ddp {

struct trainer_options {
  // Seeds the sampler's order; with the same seed every run visits the data identically.
  std::uint64_t seed = 0;
};

using trainer_slots =
    policy::slot_list<buffer_sync::slot, unused_params::slot, sampler::slot, bucket_cap_detail::slot, optim::slot,
                      update::slot, comm_hook::slot, engine_detail::communicator_slot, engine_detail::device_slot>;

namespace detail {

// Each slot's check; it fires before anything is built from the policy, with one message that
// names the slot and the missing member.
template <class Slot, class P>
struct slot_check;
template <class P>
struct slot_check<buffer_sync::slot, P> : std::bool_constant<buffer_sync::diagnose<P>()> {};
template <class P>
struct slot_check<unused_params::slot, P> : std::bool_constant<unused_params::diagnose<P>()> {};
template <class P>
struct slot_check<update::slot, P> : std::bool_constant<update::diagnose<P>()> {};
template <class P>
struct slot_check<comm_hook::slot, P> : std::bool_constant<comm_hook::diagnose<P>()> {};
template <class P>
struct slot_check<bucket_cap_detail::slot, P> : std::bool_constant<bucket_cap_detail::diagnose<P>()> {};
template <class P>
struct slot_check<optim::slot, P> : std::bool_constant<optim::diagnose<P>()> {};
template <class P>
struct slot_check<sampler::slot, P> : std::bool_constant<sampler::diagnose<P>()> {};

// Stands in for the core of a policy list that already failed with its slot's message.
struct invalid_core {
  using communicator_type = invalid_core;
  using device_type = invalid_core;
  template <class... Args>
  invalid_core(Args&&...) {}
};

// Sorts the policies into their slots and checks each; the core is instantiated only for a
// valid list.
template <class Module, class... Policies>
struct trainer_policies {
  using resolved = policy::resolve<trainer_slots, Policies...>;
  static_assert(resolved::valid, "ddp: see the policy error above");
  template <class Slot>
  using get = typename resolved::template get<Slot>;

  using buffer_sync = get<ddp::buffer_sync::slot>;
  using unused_params = get<ddp::unused_params::slot>;
  using sampler = get<ddp::sampler::slot>;
  using buckets = get<bucket_cap_detail::slot>;
  using optimizer = get<optim::slot>;
  using update = get<ddp::update::slot>;
  using comm_hook = get<ddp::comm_hook::slot>;
  using communicator = typename get<engine_detail::communicator_slot>::type;
  using device = typename get<engine_detail::device_slot>::type;

  static constexpr bool valid =
      engine_detail::diagnose_communicator_slot<communicator>() && engine_detail::diagnose_device_slot<device>() &&
      slot_check<ddp::buffer_sync::slot, buffer_sync>::value && slot_check<ddp::unused_params::slot, unused_params>::value &&
      slot_check<ddp::update::slot, update>::value && slot_check<ddp::comm_hook::slot, comm_hook>::value &&
      slot_check<bucket_cap_detail::slot, buckets>::value &&
      slot_check<optim::slot, optimizer>::value && slot_check<ddp::sampler::slot, sampler>::value;
  static constexpr bool needs_reports() {
    if constexpr (requires { unused_params::needs_ready_reports; }) return unused_params::needs_ready_reports;
    else return false;
  }
  static_assert(!needs_reports() || reports_gradient_ready<Module>,
                "ddp: this unused_params policy (forbid, the default; detect_each_step; static_graph; or one that "
                "declares needs_ready_reports) and others like it need a module that reports ready gradients, "
                "or an unused parameter would pass unseen: declare `static constexpr bool reports_gradient_ready = "
                "true;` and call ready(i) in backward for every parameter that got a gradient; or, for a module "
                "that cannot report, list ddp::unused_params::unchecked (every parameter counts as used).");
  using core = std::conditional_t<valid, trainer_core<Module, communicator, device>, invalid_core>;
};

// "slot=name, slot=name, ...", written once for every trainer type; a slot with no name is left out.
inline std::string describe_policies(std::initializer_list<std::pair<std::string_view, std::string_view>> slots) {
  std::string s;
  for (const auto& [slot, name] : slots)
    if (!name.empty()) s.append(s.empty() ? "" : ", ").append(slot).append("=").append(name);
  return s;
}

// The policy objects, one part each; a base of ddp::trainer so they exist before its core.
template <class P, bool Valid = P::valid>
struct trainer_part_holder {
  trainer_part_holder(typename P::optimizer opt) : optimizer(std::move(opt)) {}
  buffer_sync_adapter<typename P::buffer_sync> buffer_sync;
  unused_params_adapter<typename P::unused_params> unused_params;
  update_adapter<typename P::update> update;
  comm_hook_adapter<typename P::comm_hook, typename P::device> comm_hook;
  bucket_adapter<typename P::buckets> buckets;
  optimizer_adapter<typename P::optimizer, typename P::device> optimizer;

  trainer_parts_ref<typename P::device> parts() { return {buffer_sync, unused_params, update, comm_hook, buckets, optimizer}; }
};
// An invalid policy list has already failed with its slot's message: build nothing from it.
template <class P>
struct trainer_part_holder<P, false> {
  trainer_part_holder(typename P::optimizer) {}
};

}  // namespace detail

template <class Module, class... Policies>
class trainer : private detail::trainer_part_holder<detail::trainer_policies<Module, Policies...>>,
                public detail::trainer_policies<Module, Policies...>::core {
  using policies = detail::trainer_policies<Module, Policies...>;
  using holder = detail::trainer_part_holder<policies>;

 public:
  using core_type = typename policies::core;
  using buffer_sync_policy = typename policies::buffer_sync;
  using unused_params_policy = typename policies::unused_params;
  using sampler_policy = typename policies::sampler;
  using bucket_policy = typename policies::buckets;
  using optimizer_type = typename policies::optimizer;
  using update_policy = typename policies::update;
  using comm_hook_policy = typename policies::comm_hook;
  using typename core_type::communicator_type;
  using typename core_type::device_type;
  static_assert(optim::applies_update<optimizer_type>() || !update_policy::gathers_parameters,
                "ddp: optim::external leaves the update to your optimizer, which needs every parameter's averaged "
                "gradient; under update::sharded a rank holds only its shard: use update::replicated");

  trainer(Module& module, communicator_type& comm, device_type& dev, optimizer_type opt = {},
          trainer_options options = {})
      : holder(std::move(opt)), core_type(module, comm, dev, holder::parts()), options_(options) {}

  // The optimizer's hyper-parameters; changes apply from the next step (schedules).
  optimizer_type& optimizer() noexcept { return holder::optimizer.optimizer; }
  const optimizer_type& optimizer() const noexcept { return holder::optimizer.optimizer; }
  // The policy object in `Slot` (a user policy's settings, say); changes apply from the next call.
  template <class Slot>
  auto& policy() noexcept {
    if constexpr (std::is_same_v<Slot, buffer_sync::slot>) return holder::buffer_sync.policy;
    else if constexpr (std::is_same_v<Slot, unused_params::slot>) return holder::unused_params.policy;
    else if constexpr (std::is_same_v<Slot, update::slot>) return holder::update.policy;
    else if constexpr (std::is_same_v<Slot, comm_hook::slot>) return holder::comm_hook.policy;
    else if constexpr (std::is_same_v<Slot, bucket_cap_detail::slot>) return holder::buckets.policy;
    else if constexpr (std::is_same_v<Slot, optim::slot>) return holder::optimizer.optimizer;
    else static_assert(std::is_same_v<Slot, buffer_sync::slot>, "ddp: policy<Slot>(): no such slot in a trainer");
  }

  // This rank's share of the next epoch (its indices, and which are padding); the trainer
  // advances the epoch itself (P4).
  shard next_epoch_shard(std::size_t dataset_size) {
    const auto& comm = this->communicator();
    return sampler::make_shard<sampler_policy>(dataset_size, comm.rank(), comm.size(), options_.seed, epoch_++);
  }
  std::vector<std::size_t> next_epoch_indices(std::size_t dataset_size) {
    return next_epoch_shard(dataset_size).indices;
  }
  // Batches of a loader for the next epoch (a loader that shuffles on its own cannot be
  // combined with a distributed sampler, which already shuffles per epoch: P4).
  template <class Loader>
  auto epoch(Loader& loader) {
    if constexpr (diagnose_loader<Loader>()) return epoch_checked(loader);
  }
  std::uint64_t epochs_started() const noexcept { return epoch_; }
  // Steps this rank takes per epoch with ddp::data::loader, equal on every rank (a short last
  // batch counts when the sampler visits every sample).
  std::size_t steps_per_epoch(std::size_t dataset_size, std::size_t batch) const {
    return sampler::batches_per_epoch<sampler_policy>(dataset_size, this->communicator().size(), batch);
  }

  // Checkpoints: everything this run needs to continue, bitwise as if it had not stopped:
  // parameters, buffers, optimizer state and update counts, the step count, the sampler's seed
  // and epoch, and the batches of the current epoch already taken. Every rank writes its own file
  // (under update::sharded, its shard of the optimizer state) into dir/step-N/; dir/LATEST
  // commits the checkpoint once every file is on disk, and older step directories go. A crash at
  // any point leaves the previous checkpoint whole. Collective; between steps. `dir` must be one
  // directory every rank can reach (a shared file system across hosts). The optimizer's
  // hyper-parameters, parameter groups and clipping are the program's: set them as before.
  void save(const std::filesystem::path& dir) { detail::save_checkpoint(core(), dir, position()); }
  // Loads the checkpoint committed in `dir`. The next epoch(loader) continues the epoch it was
  // saved in, after the batches already taken (at the same world size), or starts the next one.
  // Another model, bucket plan, optimizer or policy list, a truncated or corrupt file, or a
  // mid-epoch checkpoint at another world size is an error on every rank naming the file and what
  // differs, and changes nothing. At another world size the optimizer state's shards are re-cut.
  // Collective; between steps.
  void load(const std::filesystem::path& dir) {
    const auto saved = detail::load_checkpoint(core(), dir, position());
    options_.seed = saved.seed;
    epoch_ = saved.epoch_finished ? saved.epochs_started : saved.epochs_started - 1;
    resume_skip_ = saved.epoch_finished ? std::nullopt : std::optional<std::uint64_t>(saved.batches_in_epoch);
    epoch_start_ = this->micro_batches_run();
    epoch_length_.reset();
  }

  // "slot=name, ..." of the policy types.
  static std::string describe_policies() {
    return describe_slots(/*with_communicator=*/true, type_hook_name());
  }
  // The same, with choices made at run time (the hook a comm_hook::one_of selected).
  std::string describe() const { return describe_slots(/*with_communicator=*/true, hook_name()); }

 private:
  core_type& core() noexcept { return *this; }

  // The plain reduction goes unnamed, so that a trainer reads, and its checkpoints match, as one
  // without a hook.
  static std::string unless_none(std::string hook) { return comm_hook::is_plain(hook) ? std::string() : hook; }
  static std::string type_hook_name() { return unless_none(std::string(comm_hook_policy::name)); }
  std::string hook_name() const {
    if constexpr (requires { holder::comm_hook.policy.describe(); })
      return unless_none(holder::comm_hook.policy.describe());
    else return type_hook_name();
  }

  // "slot=name, ..." of every slot; a checkpoint must match all but the communicator (a run
  // saved in-process may go on under mpirun).
  static std::string describe_slots(bool with_communicator, const std::string& hook) {
    const std::string bucket_cap = bucket_policy{}.describe();
    return detail::describe_policies({{"buffer_sync", buffer_sync_policy::name},
                                      {"unused_params", unused_params_policy::name},
                                      {"bucket_cap", bucket_cap},
                                      {"optimizer", optimizer_type::name},
                                      {"update", update_policy::name},
                                      {"comm_hook", hook},
                                      {"communicator", with_communicator ? communicator_type::backend_name : ""},
                                      {"sampler", sampler_policy::name}});
  }
  std::string checkpoint_policies() const { return describe_slots(/*with_communicator=*/false, hook_name()); }
  detail::run_position position() const {
    const std::uint64_t taken = this->micro_batches_run() - epoch_start_;
    return {checkpoint_policies(), options_.seed, epoch_, taken,
            epoch_ == 0 || (epoch_length_ && taken >= *epoch_length_)};
  }

  template <class Loader>
  auto epoch_checked(Loader& loader) {
    static_assert(!(Loader::shuffles_itself && sampler_policy::is_distributed),
                  "ddp: this loader shuffles on its own, but the trainer's distributed sampler "
                  "already orders the data per epoch (pitfall P4); use a loader without a "
                  "shuffle of its own (ddp::data::loader<Dataset, Collate>), or sampler::contiguous");
    auto batches = [&] {
      if constexpr (loader_requirements::has_shard_batches<Loader>)
        return loader.batches(next_epoch_shard(loader.dataset_size()));
      else
        return loader.batches(next_epoch_indices(loader.dataset_size()));
    }();
    epoch_start_ = this->micro_batches_run();
    epoch_length_.reset();
    if constexpr (std::ranges::sized_range<decltype(batches)>) epoch_length_ = std::ranges::size(batches);
    if (resume_skip_) {  // a checkpoint's epoch: its first batches were taken before it was saved
      skip_taken(batches, static_cast<std::size_t>(*resume_skip_));
      epoch_start_ -= *resume_skip_;
      resume_skip_.reset();
    }
    return batches;
  }
  template <class Range>
  void skip_taken(Range& batches, std::size_t n) {
    if constexpr (requires { batches.skip(n); }) {
      batches.skip(n);
    } else if constexpr (requires { batches.erase(batches.begin(), batches.begin() + 1); }) {
      batches.erase(batches.begin(), batches.begin() + static_cast<std::ptrdiff_t>(std::min(n, batches.size())));
    } else {
      throw error("trainer", "epoch", this->communicator().rank(),
                  "resuming in the middle of an epoch skips the " + std::to_string(n) +
                      " batches taken before the checkpoint, but this loader's range can do neither skip(n) nor "
                      "erase: return a ddp::data::batch_stream or a std::vector, or save at the end of an epoch");
    }
  }

  trainer_options options_;
  std::uint64_t epoch_ = 0;
  std::uint64_t epoch_start_ = 0;            // micro_batches_run() when the current epoch began
  std::optional<std::size_t> epoch_length_;  // its batches, when the loader's range says
  std::optional<std::uint64_t> resume_skip_;  // batches of the next epoch() a loaded checkpoint took
};

// Whether `dir` holds a committed checkpoint (trainer.load(dir) would find one).
inline bool has_checkpoint(const std::filesystem::path& dir) {
  return detail::checkpoint_directory{dir}.committed().has_value();
}

}  // namespace ddp
