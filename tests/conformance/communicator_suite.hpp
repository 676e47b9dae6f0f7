#pragma once
// The communicator conformance suite, written once and run inside every rank of every backend
// (in-process threads, MPI processes, NCCL). Each function runs on all ranks of `comm`.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "expected.hpp"
#include "ddp/comm/collectives.hpp"
#include "ddp/host/half.hpp"
#include "../support/sanitized.hpp"

namespace conformance {

// First index where `got` differs from `want(i)`, or -1.
template <class T, class Want>
long long first_mismatch(std::span<const T> got, Want want) {
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want(i))) return static_cast<long long>(i);
  return -1;
}

// Counts around every edge: none, one, fewer than a slice, several slices with a tail, and
// many. Under a sanitizer "many" is 4099 rather than 65537: the same code paths (every rank
// still gets several 64-byte slices and a tail), and instrumented per-element loops over 65537
// elements at 5 world sizes took a minute of the sanitizer stage's time.
inline const std::vector<std::size_t>& small_counts() {
#if DDP_TEST_SANITIZED
  static const std::vector<std::size_t> counts{0, 1, 7, 1001, 4099};
#else
  static const std::vector<std::size_t> counts{0, 1, 7, 1001, 65537};
#endif
  return counts;
}
// The large case: 64 MiB, past any cache. Under a sanitizer 4 MiB: large enough that the
// in-process backend's per-rank slices pass its one size threshold (non-temporal stores from
// 1 MiB, host::stream_output_bytes) at 2 to 4 ranks, without instrumented per-element loops over
// 64 MiB at 5 world sizes (3.5 minutes of the sanitizer stage's time).
#if DDP_TEST_SANITIZED
constexpr std::size_t large_bytes = std::size_t{4} << 20;
#else
constexpr std::size_t large_bytes = std::size_t{64} << 20;
#endif

template <class T, class Comm>
void all_reduce_case(Comm& comm, std::size_t n, ddp::reduce_op op, bool in_place) {
  const int r = comm.rank(), w = comm.size();
  std::vector<T> send(n), recv(n, T{});
  for (std::size_t i = 0; i < n; ++i) send[i] = input<T>(r, i);
  if (in_place) {
    ddp::comm::all_reduce(comm, std::span<T>(send), op);
    recv.swap(send);
  } else {
    ddp::comm::all_reduce(comm, std::span<const T>(send), std::span<T>(recv), op);
    CHECK(first_mismatch<T>(send, [&](std::size_t i) { return input<T>(r, i); }) == -1);
  }
  INFO("all_reduce ", ddp::name_of(ddp::dtype_of<T>), " ", ddp::name_of(op), " count ", n,
       in_place ? " in place" : " out of place", " world ", w, " rank ", r);
  CHECK(first_mismatch<T>(recv, [&](std::size_t i) { return expected_reduction<T>(w, i, op); }) ==
        -1);
}

template <class Comm>
void all_reduce_cases(Comm& comm) {
  for (auto op : {ddp::reduce_op::sum, ddp::reduce_op::avg, ddp::reduce_op::min,
                  ddp::reduce_op::max})
    for (std::size_t n : small_counts())
      for (bool in_place : {true, false}) {
        all_reduce_case<float>(comm, n, op, in_place);
        all_reduce_case<double>(comm, n, op, in_place);
        all_reduce_case<std::int32_t>(comm, n, op, in_place);
        all_reduce_case<std::int64_t>(comm, n, op, in_place);
      }
  all_reduce_case<float>(comm, large_bytes / sizeof(float) + 3, ddp::reduce_op::sum, true);
  all_reduce_case<double>(comm, large_bytes / sizeof(double), ddp::reduce_op::avg, false);
}

template <class T, class Comm>
void broadcast_case(Comm& comm, std::size_t n, int root) {
  std::vector<T> data(n);
  for (std::size_t i = 0; i < n; ++i) data[i] = input<T>(comm.rank(), i);
  ddp::comm::broadcast(comm, std::span<T>(data), root);
  INFO("broadcast ", ddp::name_of(ddp::dtype_of<T>), " count ", n, " root ", root, " rank ",
       comm.rank());
  CHECK(first_mismatch<T>(data, [&](std::size_t i) { return input<T>(root, i); }) == -1);
}

template <class Comm>
void broadcast_cases(Comm& comm) {
  for (int root : {0, comm.size() - 1})
    for (std::size_t n : small_counts()) {
      broadcast_case<float>(comm, n, root);
      broadcast_case<double>(comm, n, root);
      broadcast_case<std::int32_t>(comm, n, root);
      broadcast_case<std::int64_t>(comm, n, root);
      broadcast_case<std::uint8_t>(comm, n, root);
    }
  broadcast_case<float>(comm, large_bytes / sizeof(float) + 1, comm.size() / 2);
}

template <class T, class Comm>
void all_gather_case(Comm& comm, std::size_t n, bool in_place) {
  const int r = comm.rank(), w = comm.size();
  std::vector<T> recv(n * w, T{});
  std::vector<T> own(n);
  for (std::size_t i = 0; i < n; ++i) own[i] = input<T>(r, i);
  if (in_place) {
    std::copy(own.begin(), own.end(), recv.begin() + static_cast<std::ptrdiff_t>(n * r));
    ddp::comm::all_gather(comm, std::span<const T>(recv.data() + n * r, n), std::span<T>(recv));
  } else {
    ddp::comm::all_gather(comm, std::span<const T>(own), std::span<T>(recv));
  }
  INFO("all_gather ", ddp::name_of(ddp::dtype_of<T>), " count ", n, " world ", w, " rank ", r);
  CHECK(first_mismatch<T>(recv, [&](std::size_t i) {
          return input<T>(static_cast<int>(i / n), i % n);
        }) == -1);
}

template <class Comm>
void all_gather_cases(Comm& comm) {
  for (std::size_t n : small_counts())
    for (bool in_place : {false, true}) {
      all_gather_case<float>(comm, n, in_place);
      all_gather_case<double>(comm, n, in_place);
      all_gather_case<std::int32_t>(comm, n, in_place);
      all_gather_case<std::int64_t>(comm, n, in_place);
      all_gather_case<std::uint8_t>(comm, n, in_place);
    }
  all_gather_case<float>(comm, large_bytes / sizeof(float) / comm.size() + 5, false);
}

template <class T, class Comm>
void reduce_scatter_case(Comm& comm, std::size_t n, ddp::reduce_op op, bool in_place) {
  const int r = comm.rank(), w = comm.size();
  std::vector<T> send(n * w);
  for (std::size_t i = 0; i < send.size(); ++i) send[i] = input<T>(r, i);
  std::vector<T> recv(n, T{});
  if (in_place) {
    ddp::comm::reduce_scatter(comm, std::span<const T>(send), std::span<T>(send.data() + n * r, n), op);
    std::copy_n(send.begin() + static_cast<std::ptrdiff_t>(n * r), n, recv.begin());
  } else {
    ddp::comm::reduce_scatter(comm, std::span<const T>(send), std::span<T>(recv), op);
  }
  INFO("reduce_scatter ", ddp::name_of(ddp::dtype_of<T>), " ", ddp::name_of(op), " count ", n,
       " world ", w, " rank ", r);
  CHECK(first_mismatch<T>(recv, [&](std::size_t i) {
          return expected_reduction<T>(w, n * r + i, op);
        }) == -1);
}

template <class Comm>
void reduce_scatter_cases(Comm& comm) {
  for (auto op : {ddp::reduce_op::sum, ddp::reduce_op::avg, ddp::reduce_op::min,
                  ddp::reduce_op::max})
    for (std::size_t n : small_counts())
      for (bool in_place : {false, true}) {
        reduce_scatter_case<float>(comm, n, op, in_place);
        reduce_scatter_case<double>(comm, n, op, in_place);
        reduce_scatter_case<std::int32_t>(comm, n, op, in_place);
        reduce_scatter_case<std::int64_t>(comm, n, op, in_place);
      }
  reduce_scatter_case<float>(comm, large_bytes / sizeof(float) / comm.size() + 1,
                             ddp::reduce_op::sum, false);
}

// f16 and bf16, which have no C++ type here: raw 16-bit buffers, converted with the host's
// formats. Sums of the integer inputs are exact in 16 bits at these world sizes (at most 11 * 8 <
// 2^8), so sum, min and max must be exact in any summation order; avg is exact at a power-of-two
// world and within one 16-bit ulp otherwise (a backend may divide before or after the sum).
template <class Format, class Comm>
void half_case(Comm& comm, std::size_t n, ddp::reduce_op op, bool scatter, bool in_place) {
  const int r = comm.rank(), w = comm.size();
  constexpr ddp::dtype type = Format::type;
  const std::size_t total = scatter ? n * static_cast<std::size_t>(w) : n;
  std::vector<std::uint16_t> send(total), recv(n, 0);
  for (std::size_t i = 0; i < total; ++i) send[i] = Format::to(input<float>(r, i));
  const std::size_t first = scatter ? n * static_cast<std::size_t>(r) : 0;  // of the result in the inputs
  if (scatter) {
    std::uint16_t* out = in_place ? send.data() + first : recv.data();
    comm.reduce_scatter(ddp::const_buffer{send.data(), total, type}, ddp::mutable_buffer{out, n, type}, op).wait();
    if (in_place) std::copy_n(send.begin() + static_cast<std::ptrdiff_t>(first), n, recv.begin());
  } else if (in_place) {
    comm.all_reduce(ddp::const_buffer{send.data(), n, type}, ddp::mutable_buffer{send.data(), n, type}, op).wait();
    recv = send;
  } else {
    comm.all_reduce(ddp::const_buffer{send.data(), n, type}, ddp::mutable_buffer{recv.data(), n, type}, op).wait();
  }
  const bool exact = op != ddp::reduce_op::avg || (w & (w - 1)) == 0;
  const float ulp = type == ddp::dtype::bf16 ? 0x1p-7f : 0x1p-10f;  // relative, at the top of a binade
  const char* collective = scatter ? "reduce_scatter " : "all_reduce ";
  INFO(collective, ddp::name_of(type), " ", ddp::name_of(op), " count ", n,
       in_place ? " in place" : " out of place", " world ", w, " rank ", r);
  CHECK(first_mismatch<std::uint16_t>(recv, [&](std::size_t i) -> std::uint16_t {
          const float want = expected_reduction<float>(w, first + i, op), got = Format::from(recv[i]);
          if (exact || std::fabs(got - want) > ulp * std::fabs(want)) return Format::to(want);
          return recv[i];
        }) == -1);
}

template <class Comm>
void half_cases(Comm& comm) {
  auto each_format = [&](auto format) {
    using F = decltype(format);
    for (auto op : {ddp::reduce_op::sum, ddp::reduce_op::avg, ddp::reduce_op::min, ddp::reduce_op::max})
      for (std::size_t n : {0, 1, 7, 1001, 8197})  // 8197: past two of the host's 4096-element chunks
        for (bool scatter : {false, true})
          for (bool in_place : {false, true}) half_case<F>(comm, n, op, scatter, in_place);
    // Moved as bytes: broadcast and all_gather.
    const int w = comm.size();
    std::vector<std::uint16_t> b(1001), all(1001 * static_cast<std::size_t>(w));
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = F::to(input<float>(comm.rank(), i));
    comm.all_gather(ddp::const_buffer{b.data(), b.size(), F::type}, ddp::mutable_buffer{all.data(), all.size(), F::type})
        .wait();
    comm.broadcast(ddp::mutable_buffer{b.data(), b.size(), F::type}, w - 1).wait();
    INFO("all_gather and broadcast of ", ddp::name_of(F::type), " rank ", comm.rank());
    CHECK(first_mismatch<std::uint16_t>(all, [&](std::size_t i) {
            return F::to(input<float>(static_cast<int>(i / b.size()), i % b.size()));
          }) == -1);
    CHECK(first_mismatch<std::uint16_t>(b, [&](std::size_t i) { return F::to(input<float>(w - 1, i)); }) == -1);
    // avg keeps a finite average finite: every rank at 2^15 (f16: its largest power of two) or
    // 2^127 (bf16) averages to it, though the 16-bit sum overflows.
    const float big = F::type == ddp::dtype::f16 ? 0x1p15f : 0x1p127f;
    std::vector<std::uint16_t> v(37, F::to(big));
    comm.all_reduce(ddp::const_buffer{v.data(), v.size(), F::type}, ddp::mutable_buffer{v.data(), v.size(), F::type},
                    ddp::reduce_op::avg)
        .wait();
    CHECK(first_mismatch<std::uint16_t>(v, [&](std::size_t) { return F::to(big); }) == -1);
  };
  each_format(ddp::host::bf16_format{});
  each_format(ddp::host::f16_format{});
}

// avg keeps a finite average finite: every rank at 2^127 averages to 2^127, though the sum
// overflows (all_reduce and reduce_scatter, f32 and f64 at its own edge).
template <class T, class Comm>
void avg_overflow_case(Comm& comm) {
  const T big = std::ldexp(T(1), std::numeric_limits<T>::max_exponent - 1);
  const std::size_t n = 37, w = static_cast<std::size_t>(comm.size());
  std::vector<T> v(n, big), scattered(n * w, big), part(n);
  ddp::comm::all_reduce(comm, std::span<T>(v), ddp::reduce_op::avg);
  ddp::comm::reduce_scatter(comm, std::span<const T>(scattered), std::span<T>(part), ddp::reduce_op::avg);
  INFO("avg of ", comm.size(), " ranks at 2^", std::numeric_limits<T>::max_exponent - 1, ", ",
       ddp::name_of(ddp::dtype_of<T>), ", rank ", comm.rank());
  CHECK(first_mismatch<T>(v, [&](std::size_t) { return big; }) == -1);
  CHECK(first_mismatch<T>(part, [&](std::size_t) { return big; }) == -1);
}

template <class Comm>
void avg_overflow_cases(Comm& comm) {
  avg_overflow_case<float>(comm);
  avg_overflow_case<double>(comm);
}

// Asynchronous forms: several collectives in flight, a blocking one behind them, waited in reverse order.
template <class Comm>
void async_cases(Comm& comm) {
  const int w = comm.size();
  std::vector<std::vector<float>> bufs(6, std::vector<float>(1000));
  for (std::size_t b = 0; b < bufs.size(); ++b)
    for (std::size_t i = 0; i < 1000; ++i) bufs[b][i] = static_cast<float>(b + i + comm.rank());
  std::vector<decltype(comm.barrier())> pending;
  for (auto& b : bufs)
    pending.push_back(comm.all_reduce(ddp::as_buffer(std::span<const float>(b)),
                                      ddp::as_buffer(std::span<float>(b)), ddp::reduce_op::sum));
  // A blocking collective issued now goes behind them.
  std::vector<float> after(10, 1.0f);
  ddp::comm::all_reduce(comm, std::span<float>(after), ddp::reduce_op::sum);
  CHECK(after[9] == static_cast<float>(w));
  if constexpr (Comm::memory_kind == ddp::device_kind::cpu)
    for (auto& p : pending) CHECK(p.test());
  for (auto it = pending.rbegin(); it != pending.rend(); ++it) it->wait();
  for (auto& p : pending) CHECK(p.test());
  for (std::size_t b = 0; b < bufs.size(); ++b) {
    INFO("async all_reduce buffer ", b, " rank ", comm.rank());
    CHECK(first_mismatch<float>(bufs[b], [&](std::size_t i) {
            return static_cast<float>(w * static_cast<int>(b + i) + w * (w - 1) / 2);
          }) == -1);
  }
  ddp::comm::barrier(comm);
}

// Non-integer data: every rank must hold the same bits, and the bits are returned so a caller
// can compare runs.
template <class Comm>
std::vector<std::uint32_t> determinism_case(Comm& comm) {
  const std::size_t n = 100003;
  std::vector<float> v(n);
  std::uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(comm.rank() + 1);
  for (auto& e : v) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    e = static_cast<float>(static_cast<double>(x >> 11) * 0x1.0p-53 * 2.0 - 1.0) * 1e3f;
  }
  ddp::comm::all_reduce(comm, std::span<float>(v), ddp::reduce_op::avg);
  std::vector<std::uint32_t> bits(n);
  std::memcpy(bits.data(), v.data(), n * 4);
  std::vector<std::int64_t> mine(bits.begin(), bits.end()), all(n * comm.size());
  ddp::comm::all_gather(comm, std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
  for (int k = 0; k < comm.size(); ++k) {
    INFO("rank ", comm.rank(), " compares its bits with rank ", k);
    CHECK(std::equal(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(n * k)));
  }
  return bits;
}

}  // namespace conformance
