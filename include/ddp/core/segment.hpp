#pragma once
#include <cstddef>

namespace ddp {

// One tensor's place in a bucket: `count` floats at `tensor` correspond to
// bucket[offset, offset + count). Kernels that pack, unpack and update take lists of these.
struct segment {
  float* tensor = nullptr;
  std::size_t offset = 0;
  std::size_t count = 0;
};

}  // namespace ddp
