// The streaming loader: batches made one at a time (on the rank's thread or a prefetch thread)
// are the batches a whole epoch collated up front would be, in the same order, so training is
// bitwise the same; a stream holds a bounded number of batches; leaving the loop early stops the
// producer; an error in the data reaches the loop at its batch. And the memory-mapped data set
// gives the same examples as the one read into memory.
#include <doctest/doctest.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "ddp/data/fashion_mnist.hpp"
#include "ddp/data/loader.hpp"
#include "ddp/data/mapped_idx.hpp"
#include "ddp/ddp.hpp"
#include "ddp/host/device.hpp"
#include "ddp/inproc/launch.hpp"
#include "trainer/test_model.hpp"

namespace data_stream_test {

namespace {

using padded = ddp::sampler::distributed<true, ddp::sampler::tail::pad>;

struct numbers {
  using example_type = int;
  std::size_t n;
  std::size_t size() const { return n; }
  int get(std::size_t i) const { return static_cast<int>(i) * 10; }
};
std::vector<int> collate_numbers(std::span<const int> xs) { return {xs.begin(), xs.end()}; }

// The batches a shard should give, collated by hand.
std::vector<std::vector<int>> expected_batches(const ddp::shard& s, std::size_t batch) {
  const std::size_t used = s.keep_partial_batch ? s.indices.size() : s.indices.size() / batch * batch;
  std::vector<std::vector<int>> out;
  for (std::size_t b = 0; b < used; b += batch) {
    out.emplace_back();
    for (std::size_t i = b; i < std::min(used, b + batch); ++i) out.back().push_back(static_cast<int>(s.indices[i]) * 10);
  }
  return out;
}

// A batch that counts how many of its kind are alive.
std::atomic<int> live{0}, peak{0};
struct counted {
  std::vector<int> values;
  explicit counted(std::vector<int> v) : values(std::move(v)) { note(); }
  counted(const counted& o) : values(o.values) { note(); }
  counted(counted&& o) noexcept : values(std::move(o.values)) { note(); }
  counted& operator=(const counted&) = default;
  counted& operator=(counted&&) = default;
  ~counted() { --live; }
  static void note() {
    const int now = ++live;
    int p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
};

}  // namespace

TEST_CASE("streamed batches equal the epoch collated up front, with and without prefetch") {
  const numbers data{23};
  for (std::size_t depth : {0, 1, 3}) {
    CAPTURE(depth);
    const ddp::data::loader loader(data, 4, &collate_numbers, ddp::data::prefetch{depth});
    CHECK(loader.prefetch_depth() == depth);
    for (int rank = 0; rank < 3; ++rank) {
      const auto shard = ddp::sampler::make_shard<padded>(data.size(), rank, 3, 7, 2);
      const auto want = expected_batches(shard, 4);
      auto stream = loader.batches(shard);
      REQUIRE(stream.size() == want.size());
      std::size_t i = 0;
      for (const auto& b : stream) {
        REQUIRE(i < want.size());
        CHECK(static_cast<const std::vector<int>&>(b) == want[i]);
        CHECK(b.weights.per_sample.size() == want[i].size());
        ++i;
      }
      CHECK(i == want.size());
    }
  }
}

TEST_CASE("a stream holds at most its prefetch depth plus the current batch, at any data set size") {
  for (std::size_t n : {100, 10000}) {
    for (std::size_t depth : {0, 2}) {
      CAPTURE(n);
      CAPTURE(depth);
      const numbers data{n};
      const ddp::data::loader loader(data, 5, [](std::span<const int> xs) { return counted({xs.begin(), xs.end()}); },
                                     ddp::data::prefetch{depth});
      live = 0;
      peak = 0;
      std::size_t seen = 0;
      for (const auto& b : loader.batches(ddp::shard::of_indices(std::vector<std::size_t>(n, 1)))) {
        CHECK(b.values.size() == 5);
        ++seen;
      }
      CHECK(seen == n / 5);
      CHECK(live == 0);
      // The current batch and the queue, plus a fixed handful in flight: the one the producer is
      // making (briefly three objects while collate's result moves into a weighted_batch and
      // out of the producer) and the one moving into `current`.
      CHECK(peak <= static_cast<int>(depth) + 5);
    }
  }
}

TEST_CASE("leaving the loop early stops the prefetch thread, a stream is a single pass") {
  const numbers data{100000};
  std::atomic<int> made{0};
  const ddp::data::loader loader(
      data, 10,
      [&](std::span<const int> xs) {
        ++made;
        return std::vector<int>(xs.begin(), xs.end());
      },
      ddp::data::prefetch{2});
  {
    auto stream = loader.batches(ddp::shard::of_indices(std::vector<std::size_t>(100000, 3)));
    int taken = 0;
    for (const auto& b : stream) {
      CHECK(b.size() == 10);
      if (++taken == 3) break;
    }
    CHECK_THROWS_WITH_AS(stream.begin(), doctest::Contains("single pass"), ddp::error);
  }  // the stream's end joins the producer: it made only what fit ahead of the loop
  CHECK(made <= 3 + 2 + 1);
  CHECK(made >= 3);
}

TEST_CASE("an error while making a batch reaches the loop at that batch, after the ones before it") {
  const numbers data{40};
  for (std::size_t depth : {0, 2}) {
    CAPTURE(depth);
    const ddp::data::loader loader(
        data, 4,
        [](std::span<const int> xs) {
          if (xs.front() == 120) throw std::runtime_error("sample 12 is corrupt");
          return std::vector<int>(xs.begin(), xs.end());
        },
        ddp::data::prefetch{depth});
    std::vector<std::size_t> in_order(40);
    for (std::size_t i = 0; i < 40; ++i) in_order[i] = i;
    int delivered = 0;
    auto run = [&] {
      for (const auto& b : loader.batches(in_order)) {
        CHECK(b.front() == delivered * 40);
        ++delivered;
      }
    };
    CHECK_THROWS_WITH_AS(run(), "sample 12 is corrupt", std::runtime_error);
    CHECK(delivered == 3);  // batches 0, 1, 2; batch 3 begins at sample 12
  }
}

namespace {
// The toy problem, one sample per row (seed 17).
struct rows : test::toy_dataset {
  explicit rows(std::size_t n) : test::toy_dataset(n, 17) {}
};

// Two epochs on this rank; `kept` trains from batches collated up front (the loader before it
// streamed), otherwise from the stream with the given prefetch depth.
std::vector<std::vector<float>> train(ddp::inproc::communicator& comm, const rows& data, std::size_t depth, bool kept) {
  test::mlp model = test::make_mlp(5);
  ddp::host::device dev;
  ddp::trainer<test::mlp, padded, ddp::bucket_cap<256>> trainer(
      model, comm, dev, ddp::optim::sgd{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.0f, .nesterov = false},
      {.seed = 5});
  const ddp::data::loader loader(data, 3, &rows::collate, ddp::data::prefetch{depth});
  for (int e = 0; e < 2; ++e) {
    auto step = [&](const auto& b) {
      trainer.step([&](auto& replica) {
        auto ce = ddp::nn::softmax_cross_entropy(replica.forward(b.x), b.y, b.weights);
        replica.backward(ce.grad);
      });
    };
    if (kept) {
      const auto all = trainer.epoch(loader).to_vector();
      for (const auto& b : all) step(b);
    } else {
      for (const auto& b : trainer.epoch(loader)) step(b);
    }
  }
  return test::parameter_values(model);
}
}  // namespace

TEST_CASE("training from the stream is bitwise the training from batches collated up front") {
  const rows data(29);
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    auto run = [&](std::size_t depth, bool kept) {
      return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) { return train(comm, data, depth, kept); });
    };
    const auto reference = run(0, true);
    CHECK(run(0, false) == reference);
    CHECK(run(2, false) == reference);
  }
}

namespace {
std::filesystem::path scratch_directory(const char* name) {
  auto dir = std::filesystem::temp_directory_path() /
             (std::string("ddp_stream_test_") + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}
std::vector<std::uint8_t> idx_bytes(std::vector<std::uint32_t> dims, std::size_t drop = 0) {
  std::vector<std::uint8_t> b{0, 0, 0x08, static_cast<std::uint8_t>(dims.size())};
  std::size_t count = 1;
  for (auto d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(d >> s));
    count *= d;
  }
  for (std::size_t i = 0; i < count - drop; ++i) b.push_back(static_cast<std::uint8_t>((i * 7 + i / 784) % 251 % (dims.size() == 1 ? 10 : 256)));
  return b;
}
void write_plain(const std::filesystem::path& p, const std::vector<std::uint8_t>& bytes) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
void write_gzip(const std::filesystem::path& p, const std::vector<std::uint8_t>& bytes) {
  gzFile f = gzopen(p.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  gzclose(f);
}
}  // namespace

TEST_CASE("a memory-mapped Fashion-MNIST gives the examples, bit for bit, of the one read into memory") {
  using fm = ddp::data::fashion_mnist;
  const auto dir = scratch_directory("mapped");
  const auto images = idx_bytes({6, 28, 28}), labels = idx_bytes({6});
  write_plain(dir / "t10k-images-idx3-ubyte", images);
  write_plain(dir / "t10k-labels-idx1-ubyte", labels);
  write_gzip(dir / "t10k-images-idx3-ubyte.gz", images);
  write_gzip(dir / "t10k-labels-idx1-ubyte.gz", labels);
  const auto loaded = fm::load(fm::split::test, dir.string());
  fm mapped = fm::map(fm::split::test, dir.string());
  REQUIRE(mapped.size() == 6);
  for (std::size_t i = 0; i < 6; ++i) {
    CHECK(mapped.get(i).label == loaded.get(i).label);
    CHECK(std::equal(mapped.get(i).image, mapped.get(i).image + fm::pixels, loaded.get(i).image));
  }
  // A copy shares the mapping and outlives the original.
  const fm copy = mapped;
  mapped = fm::load(fm::split::test, dir.string());
  CHECK(copy.get(5).label == loaded.get(5).label);
  const ddp::data::loader a(loaded, 4, &fm::collate), b(copy, 4, &fm::collate);
  const auto from_memory = a.batches({5, 0, 3, 1}).to_vector(), from_map = b.batches({5, 0, 3, 1}).to_vector();
  CHECK(from_memory[0].x.data == from_map[0].x.data);

  // Mapping refuses what it cannot map, and says what to do.
  CHECK_THROWS_WITH_AS(ddp::data::mapped_idx((dir / "t10k-images-idx3-ubyte.gz").string(), 3),
                       doctest::Contains("a gzip stream: decompress it first"), ddp::error);
  CHECK_THROWS_WITH_AS(fm::map(fm::split::train, dir.string()),
                       doctest::Contains("train-images-idx3-ubyte': No such file or directory (a mapped data set needs "
                                         "the uncompressed IDX files: decompress each .gz one"),
                       ddp::error);
  write_plain(dir / "short-images", idx_bytes({6, 28, 28}, 100));
  CHECK_THROWS_WITH_AS(ddp::data::mapped_idx((dir / "short-images").string(), 3),
                       doctest::Contains("truncated: the header says 6x28x28 = 4704 values, found 4604"), ddp::error);
  write_plain(dir / "empty", {});
  CHECK_THROWS_WITH_AS(ddp::data::mapped_idx((dir / "empty").string(), 1),
                       doctest::Contains("found a file of 0 bytes"), ddp::error);
  std::filesystem::remove_all(dir);
}

}  // namespace data_stream_test
