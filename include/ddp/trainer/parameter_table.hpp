#pragma once
// The module's tensors as the trainer keeps them: each parameter's name, the f32 value the
// optimizer updates, where its gradient accumulates, and its place in a bucket; the buffers'
// references. Built once at construction, where it also runs the checks that must pass before
// any collective touches a tensor: dtypes and sizes, every tensor on the rank's device, no
// storage listed twice, the same model on every rank. It writes and checks the checkpoint
// sections of the model (its signature and the parameters' values).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/host_collectives.hpp"
#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/concepts/module.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/tensor.hpp"
#include "ddp/policy/bucket_cap.hpp"
#include "ddp/trainer/checkpoint_file.hpp"
#include "ddp/trainer/consensus.hpp"
#include "ddp/trainer/model_checks.hpp"
#include "ddp/trainer/signature.hpp"

namespace ddp::detail {

struct param_info {
  std::string name;
  float* value = nullptr;  // the f32 value the optimizer updates: the module's, or its master copy
  float* grad = nullptr;   // f32: where backward accumulates (bucket memory when bound); 16-bit: none
  std::size_t numel = 0;
  std::size_t rows = 1;    // the shape's first dimension (a matrix view for the hooks)
  bucket_slot slot;
  dtype type = dtype::f32;       // the module's
  void* module_value = nullptr;  // 16-bit parameters: the module's own value and gradient
  void* module_grad = nullptr;
};

class parameter_table {
 public:
  // Collects the module's parameters and buffers and checks them (collective: every rank raises
  // the same error). `trainer_updates`: the trainer's optimizer updates the parameters (16-bit
  // ones need it: their f32 master copy lives in the trainer).
  template <class Module, communicator Comm, device Device>
  parameter_table(Module& module, Comm& comm, Device& dev, bool trainer_updates) : rank_(comm.rank()) {
    for (auto&& p : module.parameters()) {
      parameter_ref ref = p;
      const dtype type = ref.value.type;
      if ((type != dtype::f32 && !is_half(type)) || ref.grad.type != type)
        fail("parameter '" + ref.name + "' is " + std::string(name_of(type)) + " with a " +
             std::string(name_of(ref.grad.type)) +
             " gradient; the trainer trains f32 parameters, and bf16 or f16 ones through an f32 master "
             "copy, each with a gradient of its own dtype (cast the parameter, or keep the other dtype "
             "as a buffer)");
      if (ref.grad.numel() != ref.value.numel())
        fail("parameter '" + ref.name + "' has " + std::to_string(ref.value.numel()) + " elements but its gradient " +
             std::to_string(ref.grad.numel()));
      param_info info;
      info.name = ref.name;
      info.numel = ref.value.numel();
      const auto& shape = ref.value.shape;
      info.rows = shape.empty() || info.numel == 0 ? 1 : static_cast<std::size_t>(shape[0]);
      info.type = type;
      if (type == dtype::f32) {
        info.value = static_cast<float*>(ref.value.data);
        info.grad = static_cast<float*>(ref.grad.data);
      } else {
        info.module_value = ref.value.data;
        info.module_grad = ref.grad.data;
        half_floats_ += info.numel;
      }
      params_.push_back(std::move(info));
      refs_.push_back(std::move(ref));
    }
    if (params_.empty()) fail("the module has no parameters: there is nothing to train");
    if (half_floats_ && !trainer_updates) {
      const auto& p = *std::find_if(params_.begin(), params_.end(), [](const auto& q) { return q.type != dtype::f32; });
      fail("parameter '" + p.name + "' is " + std::string(name_of(p.type)) +
           ", trained through the trainer's f32 master copy, but optim::external leaves the update to "
           "your optimizer, which would step the 16-bit values themselves: use a trainer optimizer "
           "(ddp::optim::sgd, adamw), or give the module f32 parameters");
    }
    for (auto&& b : module.buffers()) buffer_refs_.push_back(b);
    check_devices(comm, dev, refs_, buffer_refs_);
    check_shared_storage(comm, dev, refs_);
    check_same_model(comm, dev, signature());
  }

  std::size_t size() const noexcept { return params_.size(); }
  param_info& operator[](std::size_t i) noexcept { return params_[i]; }
  const param_info& operator[](std::size_t i) const noexcept { return params_[i]; }
  auto begin() noexcept { return params_.begin(); }
  auto end() noexcept { return params_.end(); }
  auto begin() const noexcept { return params_.begin(); }
  auto end() const noexcept { return params_.end(); }
  const std::string& name(std::size_t i) const noexcept { return params_[i].name; }
  const std::vector<buffer_ref>& buffers() const noexcept { return buffer_refs_; }
  // Elements of the bf16 and f16 parameters (trained through f32 master copies).
  std::size_t half_floats() const noexcept { return half_floats_; }
  std::vector<std::size_t> numels() const {
    std::vector<std::size_t> n;
    for (const auto& p : params_) n.push_back(p.numel);
    return n;
  }
  std::vector<signature_entry> signature() const { return signature_of(refs_, buffer_refs_); }

  // Collective: every parameter takes rank 0's value (a 16-bit one in its own dtype). When a
  // rank held other values (built from another seed), rank 0 says so in one line on stderr: the
  // broadcast makes the run right (pitfall P6), but a user who meant different initial values
  // should know they are gone.
  template <communicator Comm, device Device>
  void broadcast(Comm& comm, Device& dev) {
    std::uint64_t hash = 1469598103934665603ull;  // FNV-1a over every parameter's bytes
    for (auto& p : params_) {
      std::vector<unsigned char> bytes(p.numel * size_of(p.type));
      dev.copy_to_host(bytes.data(), p.type == dtype::f32 ? p.value : p.module_value, bytes.size());
      for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ull;
    }
    const auto mine = static_cast<std::int64_t>(hash);
    const auto hashes = comm::host_all_gather(comm, dev, std::span<const std::int64_t>(&mine, 1));
    for (auto& p : params_)
      comm.broadcast(p.type == dtype::f32 ? mutable_buffer{p.value, p.numel, dtype::f32}
                                          : mutable_buffer{p.module_value, p.numel, p.type},
                     0)
          .wait();
    std::string differing;
    for (std::size_t r = 1; r < hashes.size(); ++r)
      if (hashes[r] != hashes[0]) differing += (differing.empty() ? "" : ", ") + std::to_string(r);
    if (comm.rank() == 0 && !differing.empty())
      std::fprintf(stderr,
                   "ddp: rank(s) %s built the model with other parameter values than rank 0; every rank now starts "
                   "from rank 0's (pitfall P6). Build it from the same seed on every rank to start from the same "
                   "values knowingly.\n",
                   differing.c_str());
  }

  // ---- checkpoint sections: "signature" and "parameter/<name>" (the f32 values) ---------

  template <device Device>
  void write_state(checkpoint_file& f, Device& dev) const {
    f.set_text("signature", serialize(signature()));
    for (const auto& p : params_) {
      std::vector<float> v(p.numel);
      dev.copy_to_host(v.data(), p.value, p.numel * sizeof(float));
      f.set_array("parameter/" + p.name, std::span<const float>(v));
    }
  }
  std::optional<std::string> check_state(const checkpoint_file& f) const {
    if (const auto d = first_difference(lines_of(f.text("signature")), lines_of(serialize(signature()))))
      return "'" + f.path() + "' holds another model: its entry " + std::to_string(d->index) + " is " + d->first +
             ", this module's is " + d->second;
    return std::nullopt;
  }
  template <device Device>
  void read_state(const checkpoint_file& f, Device& dev) {
    for (auto& p : params_) {
      const auto v = f.array<float>("parameter/" + p.name, p.numel);
      dev.copy_from_host(p.value, v.data(), p.numel * sizeof(float));
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw error("trainer", "construct", rank_, what); }

  int rank_;
  std::vector<parameter_ref> refs_;
  std::vector<buffer_ref> buffer_refs_;
  std::vector<param_info> params_;
  std::size_t half_floats_ = 0;
};

}  // namespace ddp::detail
