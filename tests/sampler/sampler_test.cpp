// The samplers of include/ddp/sampler: which indices each rank visits in an epoch, the epoch the
// trainer sets (pitfall P4 of docs/pitfalls.md), and the placement they refuse.
#include <doctest/doctest.h>

#include <set>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/inproc/launch.hpp"
#include "trainer/test_model.hpp"

namespace sampler_test {

TEST_CASE("P4 (sampler epoch not set): the trainer sets the epoch, orders differ per epoch, repeat per seed, and shard the data") {
  using sampler = ddp::sampler::distributed<true, ddp::sampler::tail::pad>;
  auto epoch_orders = [](std::uint64_t seed) {
    return ddp::inproc::launch(3, [seed](auto& comm) {
      test::branchy model(1);
      ddp::host::device dev;
      ddp::trainer<test::branchy, sampler> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.05f}, {.seed = seed});
      std::vector<std::vector<std::size_t>> epochs;
      for (int e = 0; e < 3; ++e) epochs.push_back(trainer.next_epoch_indices(10));
      CHECK(trainer.epochs_started() == 3);
      return epochs;
    });
  };
  auto run1 = epoch_orders(7), run2 = epoch_orders(7), other_seed = epoch_orders(8);
  CHECK(run1 == run2);
  CHECK(run1 != other_seed);
  for (int e = 0; e < 3; ++e) {
    std::multiset<std::size_t> all;
    for (int r = 0; r < 3; ++r) {
      CHECK(run1[r][e].size() == 4);  // ceil(10 / 3), padded
      all.insert(run1[r][e].begin(), run1[r][e].end());
    }
    for (std::size_t i = 0; i < 10; ++i) CHECK(all.count(i) >= 1);  // pad covers every sample
    CHECK(all.size() == 12);
  }
  CHECK(run1[0][0] != run1[0][1]);  // a new order each epoch

  // drop: disjoint shards of floor(n / world); in order: round-robin; contiguous: slices.
  std::set<std::size_t> seen;
  for (int r = 0; r < 3; ++r) {
    auto idx = ddp::sampler::distributed<true, ddp::sampler::tail::drop>::indices(10, r, 3, 1, 0);
    CHECK(idx.size() == 3);
    for (auto i : idx) CHECK(seen.insert(i).second);
  }
  CHECK(ddp::sampler::distributed<false, ddp::sampler::tail::pad>::indices(5, 1, 2, 0, 0) ==
        std::vector<std::size_t>{1, 3, 0});
  CHECK(ddp::sampler::contiguous::indices(10, 1, 3, 0, 0) == std::vector<std::size_t>{3, 4, 5});
}

TEST_CASE("the samplers reject a rank outside the world and an empty world, saying which") {
  using shuffled = ddp::sampler::distributed<true, ddp::sampler::tail::pad>;
  CHECK_THROWS_WITH_AS(shuffled::indices(10, 2, 2, 0, 0), doctest::Contains("rank 2 is outside a world of size 2"),
                       ddp::error);
  CHECK_THROWS_WITH_AS(shuffled::indices(10, -1, 2, 0, 0), doctest::Contains("rank -1 is outside a world of size 2"),
                       ddp::error);
  CHECK_THROWS_WITH_AS(shuffled::indices(10, 0, 0, 0, 0), doctest::Contains("the world size is 0; it must be at least 1"),
                       ddp::error);
  CHECK_THROWS_WITH_AS(shuffled::per_rank(10, 0), doctest::Contains("must be at least 1"), ddp::error);
  CHECK_THROWS_WITH_AS(ddp::sampler::contiguous::indices(10, 3, 3, 0, 0), doctest::Contains("rank 3 is outside"),
                       ddp::error);
  CHECK(shuffled::indices(10, 1, 2, 0, 0).size() == 5);
}

namespace {

// Every rank's shard of one epoch of n samples at `world` ranks, as sampler P deals it.
template <class P>
std::vector<ddp::shard> deal(std::size_t n, int world, std::uint64_t epoch) {
  std::vector<ddp::shard> shards;
  for (int r = 0; r < world; ++r) shards.push_back(ddp::sampler::make_shard<P>(n, r, world, 5, epoch));
  return shards;
}

// How often each of 0..n-1 is among the ranks' real samples (each rank's first real_count()
// indices), and whether every index, real or repeat, lies in 0..n-1.
struct coverage {
  std::vector<std::size_t> real_times;
  bool in_range = true;
};
coverage cover(const std::vector<ddp::shard>& shards, std::size_t n) {
  coverage c{std::vector<std::size_t>(n, 0)};
  for (const auto& s : shards) {
    for (std::size_t k = 0; k < s.indices.size(); ++k) {
      if (s.indices[k] >= n) {
        c.in_range = false;
        continue;
      }
      if (k < s.real_count()) ++c.real_times[s.indices[k]];
    }
  }
  return c;
}

}  // namespace

TEST_CASE("every sampler deals each sample to exactly one rank at worlds 1 to 8 and uneven sizes") {
  using ddp::sampler::tail;
  for (std::size_t n : {0, 1, 2, 3, 5, 7, 10, 13, 64, 97}) {
    for (int world = 1; world <= 8; ++world) {
      CAPTURE(n);
      CAPTURE(world);
      const auto w = static_cast<std::size_t>(world);
      const std::vector<std::size_t> once(n, 1);

      // pad: ceil(n / world) each; the real samples are every sample once, the rest repeats.
      for (bool shuffle : {true, false}) {
        CAPTURE(shuffle);
        const auto shards = shuffle ? deal<ddp::sampler::distributed<true, tail::pad>>(n, world, 2)
                                    : deal<ddp::sampler::distributed<false, tail::pad>>(n, world, 2);
        std::size_t real = 0;
        for (const auto& s : shards) {
          CHECK(s.world() == world);
          CHECK(s.indices.size() == (n + w - 1) / w);
          CHECK(s.keep_partial_batch);
          real += s.real_count();
        }
        CHECK(real == n);
        const auto c = cover(shards, n);
        CHECK(c.in_range);
        CHECK(c.real_times == once);
      }

      // drop and contiguous: floor(n / world) each, all real, no sample twice; the remainder unvisited.
      const auto check_disjoint = [&](const std::vector<ddp::shard>& shards) {
        std::vector<std::size_t> times(n, 0);
        bool in_range = true;
        for (const auto& s : shards) {
          CHECK(s.indices.size() == n / w);
          CHECK(s.real_count() == n / w);
          CHECK_FALSE(s.keep_partial_batch);
          for (auto i : s.indices) {
            if (i < n) ++times[i];
            else in_range = false;
          }
        }
        CHECK(in_range);
        std::size_t visited = 0;
        for (auto t : times) {
          CHECK(t <= 1);
          visited += t;
        }
        CHECK(visited == n / w * w);
      };
      check_disjoint(deal<ddp::sampler::distributed<true, tail::drop>>(n, world, 2));
      check_disjoint(deal<ddp::sampler::distributed<false, tail::drop>>(n, world, 2));
      check_disjoint(deal<ddp::sampler::contiguous>(n, world, 2));

      // trainer.evaluate()'s shard: every sample once, in order, at any world size.
      std::vector<ddp::shard> eval;
      for (int r = 0; r < world; ++r) eval.push_back(ddp::sampler::evaluation_shard(n, r, world));
      CHECK(cover(eval, n).real_times == once);
    }
  }
}

}  // namespace sampler_test
