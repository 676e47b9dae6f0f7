#pragma once
// Engine slots: which communicator and which device the trainer runs on. The defaults are the
// embedded host path (in-process ranks, CPU memory).
//   ddp::trainer<Model, ddp::use_communicator<ddp::mpi::communicator>>
#include <string_view>

#include "ddp/concepts/communicator.hpp"
#include "ddp/concepts/device.hpp"
#include "ddp/host/device.hpp"
#include "ddp/inproc/communicator.hpp"
#include "ddp/policy/slots.hpp"

namespace ddp {

namespace engine_detail {
struct communicator_slot;
struct device_slot;
}  // namespace engine_detail

template <class C>
struct use_communicator {
  static_assert(diagnose_communicator<C>());
  using slot = engine_detail::communicator_slot;
  using type = C;
  static constexpr std::string_view name = C::backend_name;
};

template <class D>
struct use_device {
  static_assert(diagnose_device<D>());
  using slot = engine_detail::device_slot;
  using type = D;
};

namespace engine_detail {
struct communicator_slot {
  static constexpr std::string_view name = "communicator";
  using default_policy = use_communicator<inproc::communicator>;
};
struct device_slot {
  static constexpr std::string_view name = "device";
  using default_policy = use_device<host::device>;
};
}  // namespace engine_detail

}  // namespace ddp
