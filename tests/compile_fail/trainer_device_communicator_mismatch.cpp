// expect: the communicator and the device disagree on where memory lives
#include <ddp/ddp.hpp>

#include "support/minimal_module.hpp"

using model = test::minimal_module;
// A GPU-memory device beside the in-process communicator, which moves host memory.
struct gpu_like_device : ddp::host::device {
  static constexpr ddp::device_kind kind = ddp::device_kind::cuda;
};
static_assert(sizeof(ddp::trainer<model, ddp::use_device<gpu_like_device>>) > 0);
int main() {}
