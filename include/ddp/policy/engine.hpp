#pragma once
// Engine slots: which communicator and which device the trainer runs on.
//   ddp::trainer<Model, ddp::use_communicator<ddp::mpi::communicator>>
// The defaults are the embedded host path: in-process ranks (ddp::inproc::communicator) and CPU
// memory (ddp::host::device). They are only named here; <ddp/ddp.hpp> brings them in, so a
// program on MPI or NCCL compiles no thread rendezvous or host kernels it does not use.
#include <string_view>
#include <type_traits>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/policy/slots.hpp"

namespace ddp::inproc {
class communicator;
}
namespace ddp::host {
class device;
}

namespace ddp::policy {

namespace engine {
struct communicator_slot;
struct device_slot;
}  // namespace engine

template <class C>
struct use_communicator {
  using slot = engine::communicator_slot;
  using type = C;
};

template <class D>
struct use_device {
  using slot = engine::device_slot;
  using type = D;
};

namespace engine {
struct communicator_slot {
  static constexpr std::string_view name = "communicator";
  using default_policy = use_communicator<inproc::communicator>;
};
struct device_slot {
  static constexpr std::string_view name = "device";
  using default_policy = use_device<host::device>;
};

template <class T>
concept complete = requires { sizeof(T); };

// The engine slots' checks: a default engine whose header is missing, then the concept.
template <class C>
consteval bool diagnose_communicator_slot() {
  static_assert(complete<C>,
                "ddp: the trainer's communicator is not defined here. The default, "
                "ddp::inproc::communicator, comes with #include <ddp/ddp.hpp> (or "
                "<ddp/inproc/communicator.hpp>); another one is named with "
                "ddp::use_communicator<C> and its header.");
  if constexpr (complete<C>) return diagnose_communicator<C>();
  else return false;
}
template <class D>
consteval bool diagnose_device_slot() {
  static_assert(complete<D>,
                "ddp: the trainer's device is not defined here. The default, ddp::host::device, "
                "comes with #include <ddp/ddp.hpp> (or <ddp/host/device.hpp>); another one is "
                "named with ddp::use_device<D> and its header.");
  if constexpr (complete<D>) return diagnose_device<D>();
  else return false;
}
}  // namespace engine

}  // namespace ddp::policy

// The short spellings: ddp::use_communicator<C>, ddp::use_device<D>, ddp::engine::...
namespace ddp {
namespace engine = policy::engine;
using policy::use_communicator;
using policy::use_device;
}  // namespace ddp
