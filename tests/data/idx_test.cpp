// The IDX reader on files the test writes (plain and gzipped, good and broken), and on the real
// Fashion-MNIST files.
#include <doctest/doctest.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ddp/data/fashion_mnist.hpp"
#include "ddp/data/idx.hpp"
#include "ddp/data/loader.hpp"

namespace data_idx_test {

namespace {

namespace fs = std::filesystem;

fs::path scratch() {
  auto dir = fs::temp_directory_path() / ("ddp_idx_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

std::vector<std::uint8_t> idx_bytes(std::vector<std::uint32_t> dims, std::size_t values, std::uint8_t type = 0x08) {
  std::vector<std::uint8_t> b{0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (auto d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(d >> s));
  for (std::size_t i = 0; i < values; ++i) b.push_back(static_cast<std::uint8_t>(i % 251));
  return b;
}

std::string write_plain(const std::string& name, const std::vector<std::uint8_t>& bytes) {
  auto path = (scratch() / name).string();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
  return path;
}

std::string write_gz(const std::string& name, const std::vector<std::uint8_t>& bytes) {
  auto path = (scratch() / name).string();
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
  return path;
}

}  // namespace

TEST_CASE("reads IDX files, gzipped or not") {
  const auto bytes = idx_bytes({3, 2, 2}, 12);
  for (const auto& path : {write_plain("a.idx", bytes), write_gz("a.idx.gz", bytes)}) {
    auto a = ddp::data::read_idx(path, 3);
    CHECK(a.dims == std::vector<std::uint32_t>{3, 2, 2});
    REQUIRE(a.values.size() == 12);
    CHECK(a.values[11] == 11);
  }
}

TEST_CASE("a missing, truncated, corrupt or mislabelled file is an error naming it and what was wrong") {
  CHECK_THROWS_WITH_AS(ddp::data::read_idx("/nonexistent/train-images-idx3-ubyte.gz", 3),
                       doctest::Contains("cannot open '/nonexistent/train-images-idx3-ubyte.gz': No such file"),
                       ddp::error);
  auto truncated = idx_bytes({10, 28, 28}, 100);
  auto path = write_gz("truncated.gz", truncated);
  CHECK_THROWS_WITH_AS(ddp::data::read_idx(path, 3),
                       doctest::Contains("truncated: the header says 10x28x28 = 7840 values, found 100"), ddp::error);
  CHECK_THROWS_WITH_AS(ddp::data::read_idx(write_plain("long", idx_bytes({2}, 3)), 1),
                       doctest::Contains("has trailing bytes"), ddp::error);
  CHECK_THROWS_WITH_AS(ddp::data::read_idx(write_plain("dims", idx_bytes({2, 2}, 4)), 1),
                       doctest::Contains("expected 1 dimensions, found 2"), ddp::error);
  CHECK_THROWS_WITH_AS(ddp::data::read_idx(write_plain("type", idx_bytes({2}, 2, 0x0d)), 1),
                       doctest::Contains("expected element type 0x08 (unsigned byte), found 0x0d"), ddp::error);
  auto not_idx = idx_bytes({2}, 2);
  not_idx[0] = 'P';
  CHECK_THROWS_WITH_AS(ddp::data::read_idx(write_plain("magic", not_idx), 1),
                       doctest::Contains("expected IDX magic bytes 00 00, found 50 00 (not an IDX file)"), ddp::error);
  // Only a Fashion-MNIST path is told where Fashion-MNIST comes from.
  CHECK_THROWS_WITH_AS(ddp::data::read_idx((scratch() / "absent.idx").string(), 1),
                       doctest::Contains("absent.idx': No such file or directory"), ddp::error);
  try {
    (void)ddp::data::read_idx((scratch() / "absent.idx").string(), 1);
  } catch (const ddp::error& e) {
    CHECK(std::string(e.what()).find("Fashion-MNIST") == std::string::npos);
  }
  // Dimensions whose product does not fit in size_t (found by reading for the fuzzer, which keeps
  // looking: tests/fuzz/idx_fuzz.cpp).
  CHECK_THROWS_WITH_AS(ddp::data::read_idx(write_plain("huge", idx_bytes({0xFFFFFFFF, 0xFFFFFFFF, 2}, 4)), 3),
                       doctest::Contains("dimensions multiply past what memory can address"), ddp::error);
  // A gzip stream cut in the middle: zlib notices the missing end.
  auto gz = write_gz("cut.gz", idx_bytes({1000}, 1000));
  const auto size = fs::file_size(gz);
  fs::resize_file(gz, size / 2);
  CHECK_THROWS_WITH_AS(ddp::data::read_idx(gz, 1), doctest::Contains("cut.gz"), ddp::error);
  fs::remove_all(scratch());
}

TEST_CASE("Fashion-MNIST from Debian's dataset-fashion-mnist: 60,000 + 10,000 labelled 28x28 images") {
  using ddp::data::fashion_mnist;
  const auto train = fashion_mnist::load(fashion_mnist::split::train);
  const auto test = fashion_mnist::load(fashion_mnist::split::test);
  CHECK(train.size() == 60000);
  CHECK(test.size() == 10000);
  std::array<int, 10> per_class{};
  for (std::size_t i = 0; i < test.size(); ++i) ++per_class[static_cast<std::size_t>(test.get(i).label)];
  for (int c : per_class) CHECK(c == 1000);
  // Normalised pixels of the training set have mean ~0 and deviation ~1.
  std::vector<fashion_mnist::example> ex;
  for (std::size_t i = 0; i < 2000; ++i) ex.push_back(train.get(i * 30));
  auto b = fashion_mnist::collate(ex);
  double mean = 0, sq = 0;
  for (float v : b.x.data) mean += v, sq += static_cast<double>(v) * v;
  mean /= static_cast<double>(b.x.size());
  CHECK(mean == doctest::Approx(0.0).epsilon(0.05).scale(1.0));
  CHECK(std::sqrt(sq / static_cast<double>(b.x.size()) - mean * mean) == doctest::Approx(1.0).epsilon(0.05));
  CHECK_THROWS_WITH_AS(fashion_mnist::load(fashion_mnist::split::train, "/nowhere"),
                       doctest::Contains("'/nowhere/train-images-idx3-ubyte.gz'"), ddp::error);
}

TEST_CASE("the loader makes full batches in the sampler's order and drops the partial one") {
  struct numbers {
    using example_type = int;
    std::size_t size() const { return 10; }
    int get(std::size_t i) const { return static_cast<int>(i) * 10; }
  };
  numbers data;
  ddp::data::loader loader(data, 3, [](std::span<const int> xs) { return std::vector<int>(xs.begin(), xs.end()); });
  auto batches = loader.batches({9, 1, 5, 2, 8, 0, 7}).to_vector();
  REQUIRE(batches.size() == 2);
  CHECK(batches[0] == std::vector<int>{90, 10, 50});
  CHECK(batches[1] == std::vector<int>{20, 80, 0});
}

}  // namespace data_idx_test
