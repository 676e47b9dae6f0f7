#pragma once
// The checks a trainer runs on the module at construction, before any collective touches a
// tensor. Each is collective and raises the same error on every rank (trainer/consensus.hpp).
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/core/tensor.hpp"
#include "ddp/trainer/consensus.hpp"
#include "ddp/trainer/signature.hpp"

namespace ddp::detail {

// Every parameter, gradient and buffer must live on this rank's device.
template <communicator C, device D>
void check_devices(C& comm, D& dev, const std::vector<parameter_ref>& params, const std::vector<buffer_ref>& buffers) {
  const device_id mine = dev.id();
  std::optional<std::string> problem;
  auto check = [&](const std::string& what, const tensor_ref& t) {
    if (problem || t.numel() == 0) return;
    const device_id declared = t.device;
    const device_id actual = dev.locate(t.data).value_or(declared);
    if (declared != mine || actual != mine)
      problem = what + " lives on " + actual.to_string() + " but this rank's device is " + mine.to_string() +
                "; move the module to the rank's device before building the trainer (rank r uses the device "
                "its launcher binds, see docs/backends.md; pitfall P3)";
  };
  for (const auto& p : params) {
    check("parameter '" + p.name + "'", p.value);
    check("the gradient of parameter '" + p.name + "'", p.grad);
  }
  for (const auto& b : buffers) check("buffer '" + b.name + "'", b.value);
  agree_or_throw(comm, dev, problem, "construct", "a tensor is not on its rank's device; the trainer was not built");
}

// Two names over one storage (a tied weight listed twice) would be reduced and updated twice,
// weight decay included: an error naming both.
template <communicator C, device D>
void check_shared_storage(C& comm, D& dev, const std::vector<parameter_ref>& params) {
  std::vector<std::size_t> order(params.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto begin = [&](std::size_t i) { return static_cast<const std::byte*>(params[i].value.data); };
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return std::pair{begin(a), a} < std::pair{begin(b), b}; });
  std::optional<std::string> problem;
  for (std::size_t k = 1; k < order.size() && !problem; ++k) {
    const auto& a = params[order[k - 1]];
    const auto& b = params[order[k]];
    if (begin(order[k]) < begin(order[k - 1]) + a.value.bytes())
      problem = "parameters '" + a.name + "' and '" + b.name + "' share storage, so the trainer would reduce and " +
                "update it twice (weight decay too); list a shared (tied) parameter once in parameters(), under " +
                "one name, as PyTorch's DistributedDataParallel does";
  }
  agree_or_throw(comm, dev, problem, "construct", "the module lists one storage under two names; the trainer was not built");
}

// The same-model check's input: every parameter's and buffer's kind, name, dtype and shape, in order.
inline std::vector<signature_entry> signature_of(const std::vector<parameter_ref>& params,
                                                 const std::vector<buffer_ref>& buffers) {
  std::vector<signature_entry> s;
  for (const auto& p : params) s.push_back({"parameter", p.name, p.value.type, p.value.shape});
  for (const auto& b : buffers) s.push_back({"buffer", b.name, b.value.type, b.value.shape});
  return s;
}

}  // namespace ddp::detail
