#pragma once
// What an example's run needs of a trainer beyond its core (ddp::trainer_core, which every
// combination of policies shares), behind one small interface: each combination then compiles a
// few forwarding functions, and the run itself is compiled once per core.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "ddp/data/batch_stream.hpp"
#include "ddp/data/shard_steps.hpp"
#include "ddp/trainer/checkpoint_retention.hpp"

namespace examples {

template <class Loader>
class trainer_policies {
 public:
  using batches = ddp::data::batch_stream<typename Loader::batch_type>;
  virtual batches epoch(Loader&) = 0;  // this rank's batches of the next epoch (P4)
  // Under reduction::invariant<V>: this rank's virtual shards of the next epoch, one stream each.
  virtual ddp::data::shard_steps<batches> epoch_shards(Loader&) = 0;
  virtual std::size_t virtual_shards() const = 0;  // V, or 0 under the plain reduction
  virtual std::size_t steps_per_epoch(std::size_t dataset_size, std::size_t batch) const = 0;
  virtual std::uint64_t epochs_started() const = 0;
  virtual void save(const std::string& dir, const ddp::save_options& options) = 0;
  virtual void load(const std::string& dir) = 0;
  virtual std::string describe() const = 0;

 protected:
  ~trainer_policies() = default;
};

template <class Trainer, class Loader>
class policies_of final : public trainer_policies<Loader> {
 public:
  using typename trainer_policies<Loader>::batches;
  explicit policies_of(Trainer& t) : t_(t) {}
  batches epoch(Loader& loader) override { return t_.epoch(loader); }
  ddp::data::shard_steps<batches> epoch_shards(Loader& loader) override {
    if constexpr (Trainer::reduction_policy::virtual_shards != 0) return t_.epoch_shards(loader);
    else throw std::logic_error("epoch_shards() under the plain reduction");
  }
  std::size_t virtual_shards() const override { return Trainer::reduction_policy::virtual_shards; }
  std::size_t steps_per_epoch(std::size_t n, std::size_t batch) const override { return t_.steps_per_epoch(n, batch); }
  std::uint64_t epochs_started() const override { return t_.epochs_started(); }
  void save(const std::string& dir, const ddp::save_options& options) override { t_.save(dir, options); }
  void load(const std::string& dir) override { t_.load(dir); }
  std::string describe() const override { return t_.describe(); }

 private:
  Trainer& t_;
};

}  // namespace examples
