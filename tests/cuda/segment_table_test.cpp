// How the GPU bucket kernels split a bucket's segments among threads (ddp/cuda/segment_table.hpp),
// checked on the host: every float is visited once, in 16-byte groups that never cross a
// segment, and every thread gets the same number of groups within one, however unequal the
// segments are.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "ddp/cuda/segment_table.hpp"

namespace cuda_segment_table_test {

namespace {

using ddp::cuda::kernels::group_span;
using ddp::cuda::kernels::segment_table;

// The fashion-MNIST model's bucket: two large weights among biases and batch-norm parameters,
// plus empty and odd-sized tensors.
std::vector<ddp::segment> model_like_segments() {
  const std::vector<std::size_t> counts{401408, 512, 512, 512, 262144, 512, 512, 512, 5120, 10, 0, 3, 7, 1};
  std::vector<ddp::segment> segs;
  std::size_t offset = 0;
  for (auto c : counts) {
    segs.push_back({nullptr, offset, c});
    offset += (c + 3) / 4 * 4;
  }
  return segs;
}

struct walk_result {
  std::vector<std::vector<int>> visits;  // per segment, per float
  std::size_t min_groups = ~std::size_t{0}, max_groups = 0;
};

walk_result walk(const segment_table& t, std::size_t threads) {
  walk_result r;
  for (unsigned k = 0; k < t.count; ++k) r.visits.emplace_back(t.s[k].count, 0);
  for (std::size_t first = 0; first < threads; ++first) {
    std::size_t mine = 0;
    ddp::cuda::kernels::for_each_group(t, first, threads, [&](group_span g) {
      ++mine;
      REQUIRE(g.index < t.count);
      REQUIRE(g.begin < g.end);
      REQUIRE(g.end <= t.s[g.index].count);
      CHECK(g.begin % segment_table::group == 0);
      CHECK((g.full() || g.end == t.s[g.index].count));
      for (std::size_t i = g.begin; i < g.end; ++i) ++r.visits[g.index][i];
    });
    r.min_groups = std::min(r.min_groups, mine);
    r.max_groups = std::max(r.max_groups, mine);
  }
  return r;
}

}  // namespace

TEST_CASE("segment_table: every float of every segment once, the work even across threads") {
  const auto segs = model_like_segments();
  const auto t = segment_table::of(segs.data(), segs.size());
  REQUIRE(t.count == segs.size());
  CHECK(t.groups() == 100352 + 128 * 6 + 65536 + 1280 + 3 + 0 + 1 + 2 + 1);
  for (std::size_t threads : {1u, 7u, 256u, 4096u, 200000u}) {
    INFO(threads, " threads");
    const auto r = walk(t, threads);
    for (unsigned k = 0; k < t.count; ++k)
      CHECK(std::all_of(r.visits[k].begin(), r.visits[k].end(), [](int v) { return v == 1; }));
    // A thread per segment would leave most threads idle while a few copy the large weights.
    CHECK(r.max_groups - r.min_groups <= 1);
  }
}

TEST_CASE("segment_table: one launch holds at most its capacity, the rest go to the next") {
  std::vector<ddp::segment> segs;
  for (std::size_t k = 0; k < segment_table::capacity + 5; ++k) segs.push_back({nullptr, 8 * k, 5});
  const auto first = segment_table::of(segs.data(), segs.size());
  CHECK(first.count == segment_table::capacity);
  CHECK(first.groups() == 2 * segment_table::capacity);
  const auto rest = segment_table::of(segs.data() + segment_table::capacity, segs.size() - segment_table::capacity);
  CHECK(rest.count == 5);
  CHECK(rest.s[0].offset == 8 * segment_table::capacity);
  const auto r = walk(rest, 3);
  for (unsigned k = 0; k < rest.count; ++k)
    CHECK(std::all_of(r.visits[k].begin(), r.visits[k].end(), [](int v) { return v == 1; }));
}

TEST_CASE("segment_table: a table of empty segments has no work") {
  std::vector<ddp::segment> segs(3);
  const auto t = segment_table::of(segs.data(), segs.size());
  CHECK(t.groups() == 0);
  const auto r = walk(t, 64);
  CHECK(r.max_groups == 0);
}

}  // namespace cuda_segment_table_test
