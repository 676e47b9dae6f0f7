#pragma once
// How the bucket kernels (pack, unpack, fused optimizers) share a list of segments among GPU
// threads. A bucket's segments differ in size by orders of magnitude (a 784x512 weight beside a
// 512-float bias), so threads are not given segments: they walk one flat sequence of 4-float
// groups, segment after segment, grid-stride, and every thread gets the same number of groups
// (within one) whatever the sizes. A group is 16 bytes of one segment (its last may be shorter),
// so the 16-byte alignment of a segment's start carries to each of its groups.
//
// Plain C++ apart from the host/device marks: the kernels use it on the GPU, the host tests check
// the split without one.
#include <algorithm>
#include <cstddef>

#include "ddp/core/host_device.hpp"
#include "ddp/core/segment.hpp"

namespace ddp::cuda::kernels {

// One launch's segments, passed by value as a kernel argument (about 3 KiB).
struct segment_table {
  static constexpr std::size_t capacity = 96;
  static constexpr std::size_t group = 4;  // floats per group

  segment s[capacity];
  std::size_t first_group[capacity + 1];  // where segment k's groups start in the flat sequence
  unsigned count = 0;

  DDP_HOST_DEVICE std::size_t groups() const { return first_group[count]; }

  // the first min(n, capacity) segments of `list`; a longer list takes several tables
  static segment_table of(const segment* list, std::size_t n) {
    segment_table t{};
    t.count = static_cast<unsigned>(std::min(n, capacity));
    t.first_group[0] = 0;
    for (unsigned k = 0; k < t.count; ++k) {
      t.s[k] = list[k];
      t.first_group[k + 1] = t.first_group[k] + (list[k].count + group - 1) / group;
    }
    return t;
  }
};

// The floats [begin, end) of segment `index` that one group covers.
struct group_span {
  unsigned index;
  std::size_t begin, end;
  DDP_HOST_DEVICE bool full() const { return end - begin == segment_table::group; }
};

// Calls f(group_span) for the flat groups first, first + stride, ... of `t`: one GPU thread's
// share when first is its global index and stride the number of threads in the grid. The
// segment index only moves forward, so the walk costs one comparison per group.
template <class F>
DDP_HOST_DEVICE void for_each_group(const segment_table& t, std::size_t first, std::size_t stride, F f) {
  const std::size_t total = t.groups();
  unsigned k = 0;
  for (std::size_t g = first; g < total; g += stride) {
    while (g >= t.first_group[k + 1]) ++k;
    const std::size_t begin = (g - t.first_group[k]) * segment_table::group;
    const std::size_t end = begin + segment_table::group < t.s[k].count ? begin + segment_table::group : t.s[k].count;
    f(group_span{k, begin, end});
  }
}

}  // namespace ddp::cuda::kernels
