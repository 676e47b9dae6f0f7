// The CUDA device's kernels against the host device's, element by element: scale, pack/unpack,
// casts (bit for bit), the fused optimizer updates (to float rounding: the GPU contracts
// multiply-adds), and PowerSGD's algebra (orthonormalisation, products, axpy).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ddp/core/random.hpp"
#include "ddp/cuda/blas.hpp"
#include "ddp/cuda/device_vector.hpp"
#include "ddp/cuda/linalg.hpp"
#include "ddp/host/device.hpp"
#include "ddp/host/linalg.hpp"
#include "ddp/optim/optimizer.hpp"
#include "support/user_optimizer.hpp"

namespace {

std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  ddp::splitmix64 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

void check_close(const std::vector<float>& got, const std::vector<float>& want, float rel = 1e-6f) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= rel * std::fabs(want[i]) + 1e-7f) && bad++ == 0) first = i;
  INFO("first mismatch at ", first, ": ", got[first], " vs ", want[first]);
  CHECK(bad == 0);
}

using dvec = ddp::cuda::device_vector<float>;

}  // namespace

TEST_CASE("cuda scale equals the host's, aligned and misaligned, with a tail") {
  ddp::cuda::device dev(0);
  ddp::host::device host;
  for (std::size_t offset : {0u, 1u}) {
    auto x = random_floats(1'000'003, 1);
    auto d = dvec::from_host(dev, x);
    dev.scale(d.data() + offset, x.size() - offset, 0.37f);
    host.scale(x.data() + offset, x.size() - offset, 0.37f);
    check_close(d.to_host(), x, 0.0f);
  }
}

TEST_CASE("cuda sum_of_squares (gradient clipping's norm) is the host's within rounding, and the same bits every run") {
  ddp::cuda::device dev(0);
  ddp::host::device host;
  for (std::size_t n : {1u, 1000u, 1'000'003u}) {
    CAPTURE(n);
    const auto x = random_floats(n, 3);
    const auto d = dvec::from_host(dev, x);
    const double gpu = dev.sum_of_squares(d.data(), n);
    CHECK(gpu == doctest::Approx(host.sum_of_squares(x.data(), n)).epsilon(1e-12));
    CHECK(dev.sum_of_squares(d.data(), n) == gpu);  // a fixed order: no atomics
  }
}

TEST_CASE("cuda pack and unpack move every segment, and skip one already in place") {
  ddp::cuda::device dev(0);
  const std::vector<std::size_t> counts{1, 5, 4096, 3, 100'001};
  std::vector<dvec> tensors;
  std::vector<std::vector<float>> values;
  std::vector<ddp::segment> segs;
  std::size_t offset = 0;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    values.push_back(random_floats(counts[k], 10 + k));
    tensors.push_back(dvec::from_host(dev, values.back()));
    segs.push_back({tensors.back().data(), offset, counts[k]});
    offset = (offset + counts[k] + 3) / 4 * 4;
  }
  auto bucket = dvec::zeros(dev, offset);
  dev.pack(segs, bucket.data());
  const auto packed = bucket.to_host();
  for (std::size_t k = 0; k < counts.size(); ++k)
    CHECK(std::equal(values[k].begin(), values[k].end(), packed.begin() + static_cast<std::ptrdiff_t>(segs[k].offset)));
  dev.scale(bucket.data(), bucket.size(), 2.0f);
  dev.unpack(segs, bucket.data());
  for (std::size_t k = 0; k < counts.size(); ++k) {
    auto got = tensors[k].to_host();
    for (auto& v : values[k]) v *= 2.0f;
    check_close(got, values[k], 0.0f);
  }
}

TEST_CASE("cuda casts f32 <-> f16 / bf16 round to nearest even, bit for bit with the host") {
  ddp::cuda::device dev(0);
  ddp::host::device host;
  auto x = random_floats(100'003, 7, -60000.0f, 60000.0f);
  for (std::size_t i = 0; i < 1000; ++i) x[i] *= 1e-9f;  // half subnormals and zeros
  const auto d = dvec::from_host(dev, x);
  // The dtype is a template argument: GCC then sees which branch of host::device::cast runs
  // (with a run-time dtype it warns about the same-dtype branch, which cannot run here).
  auto round_trip = [&]<ddp::dtype type>() {
    std::vector<std::uint16_t> want(x.size());
    host.cast({x.data(), x.size(), ddp::dtype::f32}, {want.data(), want.size(), type});
    ddp::cuda::device_vector<std::uint16_t> half(dev, x.size());
    dev.cast({d.data(), x.size(), ddp::dtype::f32}, {half.data(), x.size(), type});
    INFO("dtype ", ddp::name_of(type));
    CHECK(half.to_host() == want);
    dvec back(dev, x.size());
    dev.cast({half.data(), x.size(), type}, {back.data(), x.size(), ddp::dtype::f32});
    std::vector<float> want_back(x.size());
    host.cast({want.data(), want.size(), type}, {want_back.data(), want_back.size(), ddp::dtype::f32});
    check_close(back.to_host(), want_back, 0.0f);
  };
  round_trip.operator()<ddp::dtype::f16>();
  round_trip.operator()<ddp::dtype::bf16>();
  CHECK_THROWS_AS(dev.cast({d.data(), 4, ddp::dtype::f32}, {nullptr, 4, ddp::dtype::i32}), ddp::error);
}

TEST_CASE("cuda fused SGD and AdamW updates equal the host's") {
  ddp::cuda::device dev(0);
  ddp::host::device host;
  const std::vector<std::size_t> counts{7, 65536, 1};
  const std::size_t total = 65536 + 16;
  const auto grad = random_floats(total, 3);
  for (int variant = 0; variant < 4; ++variant) {
    std::vector<std::vector<float>> p_host;
    std::vector<dvec> p_dev;
    std::vector<ddp::segment> seg_host, seg_dev;
    std::size_t offset = 0;
    for (std::size_t k = 0; k < counts.size(); ++k) {
      p_host.push_back(random_floats(counts[k], 20 + k));
      p_dev.push_back(dvec::from_host(dev, p_host.back()));
      seg_host.push_back({p_host.back().data(), offset, counts[k]});
      seg_dev.push_back({p_dev.back().data(), offset, counts[k]});
      offset = (offset + counts[k] + 3) / 4 * 4;
    }
    auto g = dvec::from_host(dev, grad);
    auto state_host = random_floats(2 * total, 5, 0.0f, 0.1f);  // m, then v (AdamW)
    auto state = dvec::from_host(dev, state_host);
    INFO("variant ", variant);
    for (int step = 1; step <= 3; ++step) {
      if (variant < 3) {
        ddp::optim::sgd o{.lr = 0.1f, .momentum = variant == 0 ? 0.0f : 0.9f, .weight_decay = 1e-3f, .nesterov = variant == 2};
        host.elementwise<1>(seg_host, grad.data(), state_host.data(), total, o.at(step));
        dev.elementwise<1>(seg_dev, g.data(), state.data(), total, o.at(step));
      } else {
        ddp::optim::adamw o{.lr = 1e-2f};
        host.elementwise<2>(seg_host, grad.data(), state_host.data(), total, o.at(step));
        dev.elementwise<2>(seg_dev, g.data(), state.data(), total, o.at(step));
      }
    }
    for (std::size_t k = 0; k < counts.size(); ++k) check_close(p_dev[k].to_host(), p_host[k], 1e-5f);
    check_close(state.to_host(), state_host, 1e-5f);
  }
}

TEST_CASE("a user's optimizer (Lion, its kernel instantiated in tests/cuda/user_optimizer.cu) equals the host's") {
  ddp::cuda::device dev(0);
  ddp::host::device host;
  const std::size_t n = 1031;  // not a multiple of 4: the kernel's vector and scalar paths
  auto p_host = random_floats(n, 41), m_host = random_floats(n, 42, 0.0f, 0.1f);
  const auto grad = random_floats(n, 43);
  auto p = dvec::from_host(dev, p_host), m = dvec::from_host(dev, m_host), g = dvec::from_host(dev, grad);
  const user::lion lion{.lr = 1e-2f, .weight_decay = 0.1f};
  const ddp::segment seg_host{p_host.data(), 0, n}, seg_dev{p.data(), 0, n};
  for (int step = 1; step <= 3; ++step) {
    host.elementwise<1>({&seg_host, 1}, grad.data(), m_host.data(), n, lion.at(step));
    dev.elementwise<1>({&seg_dev, 1}, g.data(), m.data(), n, lion.at(step));
  }
  check_close(p.to_host(), p_host, 1e-5f);
  check_close(m.to_host(), m_host, 1e-5f);
}

TEST_CASE("cuda pack, unpack and SGD over more segments than one launch holds, of very unequal sizes") {
  ddp::cuda::device dev(0);
  ddp::host::device host;
  // 230 segments (three launches): empty, odd and 4-aligned sizes, one of 300,001 floats; every
  // tenth already lives in the bucket (a bound gradient), which pack and unpack leave alone.
  std::vector<std::size_t> counts, offsets;
  std::size_t total = 0;
  for (std::size_t k = 0; k < 230; ++k) {
    counts.push_back(k == 17 ? 300'001 : (k * 37) % 1031);
    offsets.push_back(total);
    total += (counts.back() + 3) / 4 * 4 + (k % 3 == 0 ? 4 : 0);  // some padding between slots
  }
  const auto initial = random_floats(total, 99);
  auto bucket = dvec::from_host(dev, initial);
  std::vector<float> host_bucket = initial, expected = initial;
  std::vector<dvec> tensors;
  std::vector<std::vector<float>> host_tensors;
  std::vector<ddp::segment> segs, host_segs;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    if (k % 10 == 3) {
      segs.push_back({bucket.data() + offsets[k], offsets[k], counts[k]});
      host_segs.push_back({host_bucket.data() + offsets[k], offsets[k], counts[k]});
      continue;
    }
    host_tensors.push_back(random_floats(counts[k], 1000 + k));
    std::copy(host_tensors.back().begin(), host_tensors.back().end(),
              expected.begin() + static_cast<std::ptrdiff_t>(offsets[k]));
    tensors.push_back(dvec::from_host(dev, host_tensors.back()));
    segs.push_back({tensors.back().data(), offsets[k], counts[k]});
    host_segs.push_back({host_tensors.back().data(), offsets[k], counts[k]});
  }
  dev.pack(segs, bucket.data());
  CHECK(bucket.to_host() == expected);

  dev.scale(bucket.data(), total, 2.0f);
  for (auto& v : expected) v *= 2.0f;
  dev.unpack(segs, bucket.data());
  CHECK(bucket.to_host() == expected);
  for (std::size_t k = 0, own = 0; k < counts.size(); ++k) {
    if (k % 10 == 3) continue;
    const auto got = tensors[own++].to_host();
    CHECK(std::equal(got.begin(), got.end(), expected.begin() + static_cast<std::ptrdiff_t>(offsets[k])));
  }

  // The same layout through the fused SGD, against the host kernel on a mirror of it.
  std::copy(expected.begin(), expected.end(), host_bucket.begin());
  for (auto& t : host_tensors)
    for (auto& v : t) v *= 2.0f;
  const auto grad = random_floats(total, 123);
  auto g = dvec::from_host(dev, grad);
  auto m = dvec::zeros(dev, total);
  std::vector<float> host_m(total, 0.0f);
  const ddp::optim::sgd o{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f};
  for (int step = 0; step < 2; ++step) {
    dev.elementwise<1>(segs, g.data(), m.data(), total, o.at(1));
    host.elementwise<1>(host_segs, grad.data(), host_m.data(), total, o.at(1));
  }
  check_close(bucket.to_host(), host_bucket, 1e-5f);
  check_close(m.to_host(), host_m, 1e-5f);
  for (std::size_t k = 0, own = 0; k < counts.size(); ++k)
    if (k % 10 != 3) {
      check_close(tensors[own].to_host(), host_tensors[own], 1e-5f);
      ++own;
    }
}

// Needs no GPU: the size check runs before cuBLAS is called.
TEST_CASE("cuBLAS sizes past its int range are an error naming the dimension and the device") {
  CHECK(ddp::cuda::blas::blas_int(2147483647, "m", {0, 0}) == 2147483647);
  CHECK_THROWS_WITH(ddp::cuda::blas::blas_int(std::size_t{2147483648}, "k", {3, 1}),
                    doctest::Contains("k = 2147483648 exceeds cuBLAS's int sizes (2^31 - 1) on device 1"));
}

TEST_CASE("cuda orthonormalize_columns, gemm and axpy (comm_hook::powersgd's algebra) equal the host's") {
  ddp::cuda::device dev(0);
  ddp::host::device host;
  constexpr std::size_t rows = 3001, cols = 4, inner = 257;
  // Orthonormalisation: a zero column stays zero, the rest agree to float rounding.
  auto p = random_floats(rows * cols, 21);
  for (std::size_t i = 0; i < rows; ++i) p[i * cols + 1] = 0.0f;
  auto dp = dvec::from_host(dev, p);
  ddp::cuda::orthonormalize_columns(dev, dp.data(), rows, cols, 1e-8f);
  ddp::host::orthonormalize_columns(host, p.data(), rows, cols, 1e-8f);
  check_close(dp.to_host(), p, 1e-4f);
  // C = A^T B and C = A B^T, row-major, as PowerSGD forms Q and the approximation.
  const auto a = random_floats(inner * rows, 22), b = random_floats(inner * cols, 23);
  std::vector<float> c(rows * cols, 0.0f);
  auto da = dvec::from_host(dev, a), db = dvec::from_host(dev, b), dc = dvec::from_host(dev, c);
  ddp::cuda::gemm(dev, true, false, rows, cols, inner, 1.0f, da.data(), rows, db.data(), cols, 0.0f, dc.data(), cols);
  ddp::host::gemm(host, true, false, rows, cols, inner, 1.0f, a.data(), rows, b.data(), cols, 0.0f, c.data(), cols);
  check_close(dc.to_host(), c, 1e-4f);
  // y += alpha x
  auto y = random_floats(rows, 24);
  const auto x = random_floats(rows, 25);
  auto dy = dvec::from_host(dev, y), dx = dvec::from_host(dev, x);
  ddp::cuda::axpy(dev, rows, -0.5f, dx.data(), dy.data());
  ddp::host::axpy(host, rows, -0.5f, x.data(), y.data());
  check_close(dy.to_host(), y, 1e-6f);
}
