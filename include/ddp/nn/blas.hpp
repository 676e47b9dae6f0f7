#pragma once
// The reference layers' CBLAS: the host path's wrapper (ddp/host/blas.hpp), under the name the
// layers and the example use.
#include "ddp/host/blas.hpp"

namespace ddp::nn {
namespace blas = ::ddp::host::blas;
}  // namespace ddp::nn
