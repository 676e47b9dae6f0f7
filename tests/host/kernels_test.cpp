// The host device: the device conformance suite (tests/conformance/device_suite.hpp, shared with
// the CUDA device), then what is the host's own: its x86 16-bit conversions against the portable
// loops, and the kernels its communicators reduce with (reduce_to_all, divide, stream_copy).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "conformance/device_suite.hpp"
#include "ddp/host/attention_softmax.hpp"
#include "ddp/host/device.hpp"
#include "ddp/host/kernels.hpp"
#include "ddp/host/linalg.hpp"

namespace host_kernels_test {

DDP_DEVICE_CONFORMANCE_SUITE("host device: ", ddp::host::device)

TEST_CASE("the x86 16-bit conversions give the portable loops' bits, NaNs included") {
  // Every 65537th f32 bit pattern, so every exponent, both signs, NaNs, infinities and
  // subnormals, at a count with a tail past the 8-wide loops.
  std::vector<float> x;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 65537) {
    const auto bits = static_cast<std::uint32_t>(u);
    float f;
    std::memcpy(&f, &bits, 4);
    x.push_back(f);
  }
  auto check = [&]<class F>(F) {
    std::vector<std::uint16_t> fast(x.size()), portable(x.size());
    ddp::host::narrow<F>(x.data(), fast.data(), x.size(), 0.75f);
    ddp::host::narrow_loop<F>(x.data(), portable.data(), x.size(), 0.75f);
    std::vector<float> wide_fast(x.size()), wide_portable(x.size());
    ddp::host::widen<F>(portable.data(), wide_fast.data(), x.size());
    ddp::host::widen_loop<F>(portable.data(), wide_portable.data(), x.size());
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      wrong += fast[i] != portable[i];
      wrong += std::memcmp(&wide_fast[i], &wide_portable[i], sizeof(float)) != 0;
    }
    // Every 16-bit pattern widened, signalling NaNs among them.
    std::vector<std::uint16_t> every(65536);
    for (std::size_t i = 0; i < every.size(); ++i) every[i] = static_cast<std::uint16_t>(i);
    std::vector<float> every_fast(every.size()), every_portable(every.size());
    ddp::host::widen<F>(every.data(), every_fast.data(), every.size());
    ddp::host::widen_loop<F>(every.data(), every_portable.data(), every.size());
    wrong += std::memcmp(every_fast.data(), every_portable.data(), every.size() * sizeof(float)) != 0;
    CAPTURE(ddp::name_of(F::type));
    CHECK(wrong == 0);
  };
  check(ddp::host::bf16_format{});
  check(ddp::host::f16_format{});
#if defined(DDP_HALF_X86)
  // The SSE2 form, which a CPU without AVX2 takes.
  std::vector<std::uint16_t> sse(x.size()), portable(x.size());
  ddp::host::half_x86::narrow_bf16(x.data(), sse.data(), x.size(), 0.75f);
  ddp::host::narrow_loop<ddp::host::bf16_format>(x.data(), portable.data(), x.size(), 0.75f);
  CHECK(sse == portable);
#endif
}

TEST_CASE("16-bit reductions combine in f32 and round once, in every target") {
  const std::size_t n = 10007, world = 3;
  std::vector<std::vector<std::uint16_t>> in(world, std::vector<std::uint16_t>(n));
  std::uint64_t state = 7;
  for (auto& v : in)
    for (auto& e : v) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      e = ddp::host::to_bf16(static_cast<float>(static_cast<std::int64_t>(state >> 40) - (1 << 23)) * 0x1p-20f);
    }
  std::vector<const std::uint16_t*> sources{in[0].data(), in[1].data(), in[2].data()};
  for (auto op : {ddp::reduce_op::sum, ddp::reduce_op::avg, ddp::reduce_op::min, ddp::reduce_op::max}) {
    CAPTURE(ddp::name_of(op));
    std::vector<std::uint16_t> a(n), b(n);
    std::vector<std::uint16_t*> targets{a.data(), b.data()};
    ddp::host::reduce_to_all_half<ddp::host::bf16_format>(sources, targets, n, op, world);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      float acc = ddp::host::from_bf16(in[0][i]);
      for (std::size_t k = 1; k < world; ++k) {
        const float x = ddp::host::from_bf16(in[k][i]);
        acc = op == ddp::reduce_op::min ? std::min(acc, x) : op == ddp::reduce_op::max ? std::max(acc, x) : acc + x;
      }
      if (op == ddp::reduce_op::avg) acc /= static_cast<float>(world);
      wrong += a[i] != ddp::host::to_bf16(acc) || b[i] != a[i];
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("divide gives the quotient's bits, by powers of two (a multiply) and by other divisors") {
  std::vector<float> x;
  for (float v : {1.0f, -3.0f, 0.1f, 1e-40f, -1e-45f, 3.4e38f, 0.0f, -0.0f, 7.0f / 3.0f}) x.push_back(v);
  for (int i = 1; i < 200; ++i) x.push_back(std::ldexp(static_cast<float>(i) * 1.3717f, i % 40 - 20));
  for (float divisor : {1.0f, 2.0f, 4.0f, 1024.0f, 0.5f, 3.0f, 6.0f, std::ldexp(1.0f, -140)}) {  // last: 1/x overflows
    INFO("divisor ", divisor);
    auto got = x;
    ddp::host::divide(got.data(), got.size(), divisor);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float want = x[i] / divisor;
      CHECK(std::memcmp(&got[i], &want, sizeof(float)) == 0);
    }
  }
  std::vector<std::int32_t> ints{7, -7, 9};
  ddp::host::divide(ints.data(), ints.size(), 2);
  CHECK(ints == std::vector<std::int32_t>{3, -3, 4});
}

TEST_CASE("reduce_to_all: every op over one, two and three sources, written to every target") {
  const std::size_t n = 10'000;  // several chunks, with a tail
  std::vector<std::vector<float>> data(3, std::vector<float>(n));
  for (std::size_t k = 0; k < 3; ++k)
    for (std::size_t i = 0; i < n; ++i) data[k][i] = std::sin(static_cast<float>(i * (k + 1))) * 10.0f;
  for (std::size_t sources = 1; sources <= 3; ++sources)
    for (auto op : {ddp::reduce_op::sum, ddp::reduce_op::avg, ddp::reduce_op::min, ddp::reduce_op::max}) {
      INFO(sources, " sources, op ", static_cast<int>(op));
      std::vector<const float*> src;
      for (std::size_t k = 0; k < sources; ++k) src.push_back(data[k].data());
      std::vector<float> out1(n), out2(n);
      std::vector<float*> targets{out1.data(), out2.data()};
      ddp::host::reduce_to_all<float>(src, targets, n, op, sources);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        float want = data[0][i];
        for (std::size_t k = 1; k < sources; ++k) {
          const float v = data[k][i];
          want = op == ddp::reduce_op::min ? std::min(want, v) : op == ddp::reduce_op::max ? std::max(want, v) : want + v;
        }
        if (op == ddp::reduce_op::avg) want /= static_cast<float>(sources);
        bad += out1[i] != want || out2[i] != want;
      }
      CHECK(bad == 0);
    }
}

TEST_CASE("reduce_to_all avg keeps a finite average finite where the sum overflows, and the other bits as they were") {
  const float big = std::ldexp(1.0f, 127);  // two of them sum past FLT_MAX
  for (std::size_t world : {2u, 3u}) {
    CAPTURE(world);
    std::vector<std::vector<float>> in(world, std::vector<float>{big, 1.0f, 3.0f, -big});
    in[0][2] = std::numeric_limits<float>::infinity();  // an infinite input stays infinite
    std::vector<const float*> sources;
    for (auto& v : in) sources.push_back(v.data());
    std::vector<float> out(4);
    std::vector<float*> targets{out.data()};
    ddp::host::reduce_to_all<float>(sources, targets, 4, ddp::reduce_op::avg, world);
    CHECK(std::isfinite(out[0]));
    CHECK(out[0] == doctest::Approx(big).epsilon(1e-6));
    CHECK(out[3] == doctest::Approx(-big).epsilon(1e-6));
    CHECK(out[1] == 1.0f);  // sum then divide, as before
    CHECK(std::isinf(out[2]));
  }
}

TEST_CASE("stream_copy copies like memcpy at every destination alignment, with any head and tail") {
  std::vector<unsigned char> src(4096 + 64), dst(4096 + 64);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
  for (std::size_t offset = 0; offset < 16; ++offset)
    for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{63},
                              std::size_t{64}, std::size_t{65}, std::size_t{200}, std::size_t{4096}}) {
      std::fill(dst.begin(), dst.end(), 0xEE);
      ddp::host::stream_copy(dst.data() + offset, src.data() + 1, bytes);
      ddp::host::stream_fence();
      CAPTURE(offset);
      CAPTURE(bytes);
      CHECK(std::equal(src.begin() + 1, src.begin() + 1 + static_cast<std::ptrdiff_t>(bytes), dst.begin() + static_cast<std::ptrdiff_t>(offset)));
      CHECK(std::all_of(dst.begin(), dst.begin() + static_cast<std::ptrdiff_t>(offset), [](unsigned char c) { return c == 0xEE; }));
      CHECK(std::all_of(dst.begin() + static_cast<std::ptrdiff_t>(offset + bytes), dst.end(), [](unsigned char c) { return c == 0xEE; }));
    }
}

TEST_CASE("reduce_to_all gives the same bits with and without streamed outputs") {
  const std::size_t n = ddp::host::stream_output_bytes / sizeof(float) + 37;  // past the threshold, with a tail
  std::vector<float> a(n), b(n), streamed(n + 1), plain(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = 0.1f * static_cast<float>(i % 1000);
    b[i] = 1.0f / static_cast<float>(i + 1);
  }
  const float* sources[] = {a.data(), b.data()};
  float* out_streamed[] = {streamed.data() + 1};  // misaligned by 4 bytes
  ddp::host::reduce_to_all<float>(sources, out_streamed, n, ddp::reduce_op::sum, 2);
  // In place, the outputs are inputs and are stored normally.
  std::vector<float> a2 = a;
  const float* sources2[] = {a2.data(), b.data()};
  float* out_plain[] = {a2.data()};
  ddp::host::reduce_to_all<float>(sources2, out_plain, n, ddp::reduce_op::sum, 2);
  for (std::size_t i = 0; i < n; ++i) plain[i] = a[i] + b[i];
  CHECK(std::memcmp(streamed.data() + 1, plain.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(a2.data(), plain.data(), n * sizeof(float)) == 0);
}

}  // namespace host_kernels_test
