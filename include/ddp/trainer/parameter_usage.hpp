#pragma once
// Which parameters the module used in a step, and which of them the optimizer updates: the
// unused-parameter policy's part sees the step through this component (an
// unused_params::step_view over the flags it owns), writes this rank's control floats from it,
// and rules from the averaged ones. The ruling goes on to the update stage inside the step's
// verdict (step_verdict.hpp); it is kept from step to step (a policy may rule once).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ddp/comm/host_collectives.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/core/error.hpp"
#include "ddp/trainer/parameter_table.hpp"
#include "ddp/trainer/parts.hpp"

namespace ddp::detail {

template <communicator Comm, device Device>
class parameter_usage final : public unused_params::step_view {
 public:
  parameter_usage(Comm& comm, Device& dev, const parameter_table& params, unused_params_part& policy)
      : comm_(comm), device_(dev), params_(params), policy_(policy), used_(params.size(), 0),
        reported_(params.size(), 0), updated_(params.size(), 1) {}
  parameter_usage(const parameter_usage&) = delete;
  parameter_usage& operator=(const parameter_usage&) = delete;

  // ---- what the module reports ----------------------------------------------------------------

  // The step's final backward begins: each parameter may be reported once in it.
  void begin_final_backward() { std::fill(reported_.begin(), reported_.end(), 0); }
  // Parameter i's gradient is final for this backward. True when its bucket counts it: inside the
  // final backward, the first report, and a gradient the policy expects (an unexpected one is the
  // policy's to rule on).
  bool report(std::size_t i, bool final_backward) {
    if (i >= params_.size())
      throw error("trainer", "backward", comm_.rank(),
                  "the module reported parameter index " + std::to_string(i) + " ready, but it has " +
                      std::to_string(params_.size()) + " parameters");
    used_[i] = 1;
    if (!final_backward) return false;
    if (reported_[i])
      throw error("trainer", "backward", comm_.rank(),
                  "parameter '" + params_.name(i) + "' was reported ready twice in one backward; "
                  "report each parameter once, when its gradient is final");
    reported_[i] = 1;
    if (expects_gradient(i)) return true;
    policy_.on_unexpected_gradient(*this, i);
    return false;
  }
  bool expects_gradient(std::size_t i) const { return policy_.expects_gradient(i); }
  // A module that cannot report counts every parameter as used.
  void mark_all_used() { std::fill(used_.begin(), used_.end(), 1); }
  bool any_used() const noexcept { return std::find(used_.begin(), used_.end(), 1) != used_.end(); }
  std::span<const char> used_flags() const noexcept { return used_; }
  // The step's last bucket has gone to the reduction (the control floats with it).
  void set_all_buckets_sent(bool sent) noexcept { all_sent_ = sent; }
  // A sync schedule's local step: the policy sees a world of this rank alone. Until end_step.
  void set_local(bool on) noexcept { local_ = on; }

  // ---- the policy's say -------------------------------------------------------------------------

  std::size_t control_floats() const { return policy_.control_floats(params_.size()); }
  void write_control(std::span<float> control) { policy_.write_control(*this, control); }
  // The averaged control floats are equal on every rank, so every rank rules alike.
  void rule(std::span<const float> averaged) { policy_.after_reduction(*this, averaged, updated_); }
  // A captured step: each replay updates every parameter.
  void update_every_parameter() { std::fill(updated_.begin(), updated_.end(), 1); }
  // Which parameters the optimizer updates (1) in this step, by index.
  std::span<const char> updated() const noexcept { return updated_; }
  std::vector<std::string> skipped_parameters() const {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!updated_[i]) names.push_back(params_.name(i));
    return names;
  }

  void end_step() noexcept {
    std::fill(used_.begin(), used_.end(), 0);
    all_sent_ = false;
    local_ = false;
  }

  // ---- unused_params::step_view ---------------------------------------------------------------

  std::size_t parameter_count() const noexcept override { return params_.size(); }
  const std::string& parameter_name(std::size_t i) const override { return params_.name(i); }
  bool used(std::size_t i) const noexcept override { return used_[i] != 0; }
  bool all_buckets_sent() const noexcept override { return all_sent_; }
  int rank() const noexcept override { return comm_.rank(); }
  int size() const noexcept override { return local_ ? 1 : comm_.size(); }
  std::vector<std::uint8_t> all_gather(std::span<const std::uint8_t> mine) override {
    if (local_) return {mine.begin(), mine.end()};
    return comm::host_all_gather(comm_, device_, mine);
  }

 private:
  Comm& comm_;
  Device& device_;
  const parameter_table& params_;
  unused_params_part& policy_;
  std::vector<char> used_;      // reported in any backward of this step
  std::vector<char> reported_;  // reported in the final backward
  std::vector<char> updated_;   // the optimizer updates parameter i (the policy's ruling)
  bool all_sent_ = false;
  bool local_ = false;
};

}  // namespace ddp::detail
