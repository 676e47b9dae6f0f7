// The vocabulary of include/ddp/core: what each header promises, checked through its public face.
// Only core headers are included, so this unit compiles in a moment.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/core/buffer.hpp"
#include "ddp/core/buffer_version.hpp"
#include "ddp/core/cpu_affinity.hpp"
#include "ddp/core/device_id.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/issue_mode.hpp"
#include "ddp/core/random.hpp"
#include "ddp/core/ready_sink.hpp"
#include "ddp/core/reduce_op.hpp"
#include "ddp/core/sample_weights.hpp"
#include "ddp/core/segment.hpp"
#include "ddp/core/shard.hpp"
#include "ddp/core/spin_wait.hpp"
#include "ddp/core/tensor.hpp"

namespace core_test {

TEST_CASE("ddp::error says where: the backend, the operation and the rank before the message, and gives each part back") {
  const ddp::error e("inproc", "all_reduce", 2, "count 7 differs from rank 0's 8");
  CHECK(std::string(e.what()) == "ddp[inproc] all_reduce on rank 2: count 7 differs from rank 0's 8");
  CHECK(e.backend() == "inproc");
  CHECK(e.operation() == "all_reduce");
  CHECK(e.rank() == 2);
  CHECK(e.detail() == "count 7 differs from rank 0's 8");

  // Rank 0 is a rank; -1 (a file reader, say) leaves the rank out.
  CHECK(std::string(ddp::error("trainer", "step", 0, "x").what()) == "ddp[trainer] step on rank 0: x");
  const ddp::error no_rank("data", "read_idx", -1, "/no/such/file: cannot open");
  CHECK(std::string(no_rank.what()) == "ddp[data] read_idx: /no/such/file: cannot open");
  CHECK(no_rank.rank() == -1);

  // Caught as what the standard library throws, the text is the same.
  try {
    throw ddp::error("mpi", "broadcast", 3, "boom");
  } catch (const std::runtime_error& r) {
    CHECK(std::string(r.what()) == "ddp[mpi] broadcast on rank 3: boom");
  }
}

TEST_CASE("collective_error, peer_error and timeout_error are ddp::errors with the same text, and a peer error names the rank at fault") {
  const ddp::collective_error agreed("trainer", "construct", 1, "parameter 'w' is unused");
  CHECK(std::string(agreed.what()) == "ddp[trainer] construct on rank 1: parameter 'w' is unused");
  const ddp::error& as_error = agreed;
  CHECK(as_error.rank() == 1);

  const ddp::peer_error peer("inproc", "all_reduce", 0, 2, "rank 2 failed: NaN in backward of rank 2");
  CHECK(std::string(peer.what()) == "ddp[inproc] all_reduce on rank 0: rank 2 failed: NaN in backward of rank 2");
  CHECK(peer.rank() == 0);         // where it was raised
  CHECK(peer.origin_rank() == 2);  // whom it is about
  CHECK(ddp::peer_error("mpi", "barrier", 1, -1, "a peer left").origin_rank() == -1);

  // A timeout is a peer error: a handler for peers catches it, with its origin.
  bool caught_as_peer = false;
  try {
    throw ddp::timeout_error("inproc", "barrier", 0, 3, "barrier #4 made no progress for 50 ms; rank 3 has not arrived");
  } catch (const ddp::peer_error& p) {
    caught_as_peer = true;
    CHECK(p.origin_rank() == 3);
    CHECK(p.operation() == "barrier");
    CHECK(p.detail() == "barrier #4 made no progress for 50 ms; rank 3 has not arrived");
  }
  CHECK(caught_as_peer);

  // A collective error is not a peer error (no peer is at fault, nothing to abort).
  bool caught_as_peer_wrongly = false;
  try {
    throw ddp::collective_error("trainer", "step", 0, "x");
  } catch (const ddp::peer_error&) {
    caught_as_peer_wrongly = true;
  } catch (const ddp::error&) {
  }
  CHECK_FALSE(caught_as_peer_wrongly);
}

TEST_CASE("dtype: every type's size and a name of its own, and C++ types map to their dtype and back") {
  struct row {
    ddp::dtype type;
    std::size_t size;
    std::string_view name;
    bool floating, half;
  };
  const std::array<row, 7> rows{{{ddp::dtype::f32, 4, "f32", true, false},
                                 {ddp::dtype::f64, 8, "f64", true, false},
                                 {ddp::dtype::i32, 4, "i32", false, false},
                                 {ddp::dtype::i64, 8, "i64", false, false},
                                 {ddp::dtype::u8, 1, "u8", false, false},
                                 {ddp::dtype::f16, 2, "f16", true, true},
                                 {ddp::dtype::bf16, 2, "bf16", true, true}}};
  std::set<std::string_view> names;
  for (const auto& r : rows) {
    CAPTURE(r.name);
    CHECK(ddp::size_of(r.type) == r.size);
    CHECK(ddp::name_of(r.type) == r.name);
    CHECK(ddp::is_floating(r.type) == r.floating);
    CHECK(ddp::is_half(r.type) == r.half);
    names.insert(ddp::name_of(r.type));
  }
  CHECK(names.size() == rows.size());  // no two share a name

  static_assert(ddp::dtype_of<float> == ddp::dtype::f32 && ddp::dtype_of<const float> == ddp::dtype::f32);
  static_assert(ddp::dtype_of<double> == ddp::dtype::f64 && ddp::dtype_of<std::int32_t> == ddp::dtype::i32);
  static_assert(ddp::dtype_of<std::int64_t> == ddp::dtype::i64 && ddp::dtype_of<std::uint8_t> == ddp::dtype::u8);

  // visit_host_dtype hands back the C++ type of each host dtype: the round trip is the identity.
  for (auto t : {ddp::dtype::f32, ddp::dtype::f64, ddp::dtype::i32, ddp::dtype::i64, ddp::dtype::u8}) {
    CAPTURE(ddp::name_of(t));
    const auto [back, size] = ddp::visit_host_dtype(t, [](auto v) {
      return std::pair{ddp::dtype_of<decltype(v)>, sizeof(v)};
    });
    CHECK(back == t);
    CHECK(size == ddp::size_of(t));
  }
  // The 16-bit formats have no host arithmetic: the error names the type and the fix.
  CHECK_THROWS_WITH_AS(ddp::visit_host_dtype(ddp::dtype::bf16, [](auto) { return 0; }),
                       "ddp: dtype bf16 has no host arithmetic; cast to f32 first", std::invalid_argument);
  CHECK_THROWS_WITH_AS(ddp::visit_host_dtype(ddp::dtype::f16, [](auto) { return 0; }),
                       doctest::Contains("dtype f16"), std::invalid_argument);
}

TEST_CASE("reduce_op: each operation has its name") {
  CHECK(ddp::name_of(ddp::reduce_op::sum) == "sum");
  CHECK(ddp::name_of(ddp::reduce_op::avg) == "avg");
  CHECK(ddp::name_of(ddp::reduce_op::min) == "min");
  CHECK(ddp::name_of(ddp::reduce_op::max) == "max");
}

TEST_CASE("splitmix64 is the reference generator bit for bit, deterministic per seed, and its draws stay in range") {
  // Vigna's splitmix64.c from state 0.
  ddp::splitmix64 ref(0);
  CHECK(ref.next() == 0xe220a8397b1dcdafull);
  CHECK(ref.next() == 0x6e789e6aa1b965f4ull);
  CHECK(ref.next() == 0x06c45d188009454full);

  ddp::splitmix64 a(42), b(42), c(43);
  std::vector<std::uint64_t> da, db, dc;
  for (int i = 0; i < 100; ++i) {
    da.push_back(a.next());
    db.push_back(b.next());
    dc.push_back(c.next());
  }
  CHECK(da == db);
  CHECK(da != dc);

  // below(bound): in [0, bound), every value reached.
  ddp::splitmix64 g(7);
  for (std::uint64_t bound : {1ull, 2ull, 3ull, 7ull, 10ull}) {
    CAPTURE(bound);
    std::set<std::uint64_t> seen;
    for (int i = 0; i < 1000; ++i) seen.insert(g.below(bound));
    CHECK(*seen.rbegin() < bound);
    CHECK(seen.size() == bound);
  }

  // uniform(lo, hi): in [lo, hi), spread over it (mean near the middle, both ends approached).
  ddp::splitmix64 u(11);
  double sum = 0.0;
  float smallest = 2.0f, largest = -2.0f;
  constexpr int draws = 100000;
  for (int i = 0; i < draws; ++i) {
    const float x = u.uniform(-1.0f, 1.0f);
    sum += x;
    smallest = std::min(smallest, x);
    largest = std::max(largest, x);
  }
  CHECK(smallest >= -1.0f);
  CHECK(largest < 1.0f);
  CHECK(std::abs(sum / draws) < 0.01);  // about 5 standard deviations of the mean
  CHECK(smallest < -0.999f);
  CHECK(largest > 0.999f);

  // Seeds whose first draw rounds up to 1.0f in float (about one seed in 2^25): still below hi.
  for (std::uint64_t seed : {63433462ull, 84351806ull, 123162318ull}) {
    CAPTURE(seed);
    CHECK(ddp::splitmix64(seed).uniform(0.0f, 1.0f) < 1.0f);
    CHECK(ddp::splitmix64(seed).uniform(-1.0f, 1.0f) < 1.0f);
    CHECK(ddp::splitmix64(seed).uniform(1.0f, 2.0f) < 2.0f);
    CHECK(ddp::splitmix64(seed).uniform(0.0f, 1.0f) > 0.99999f);  // the largest float below, not a wrap
  }
}

TEST_CASE("buffer_version counts writes and keeps the versions backward will read, innermost first") {
  ddp::buffer_version v;
  CHECK(v.value() == 0);
  CHECK_FALSE(v.innermost_saved().has_value());
  v.bump();
  v.bump();
  CHECK(v.value() == 2);

  v.save_for_backward();  // first forward sees version 2
  v.bump();
  v.save_for_backward();  // second forward sees version 3
  CHECK(v.innermost_saved() == 3u);
  v.release_saved();  // the second forward's backward runs first
  CHECK(v.innermost_saved() == 2u);
  v.release_saved();
  CHECK_FALSE(v.innermost_saved().has_value());
  v.release_saved();  // nothing saved: no effect
  CHECK(v.value() == 3);  // saving and releasing are not writes

  v.save_for_backward();
  v.save_for_backward();
  v.clear_saved();
  CHECK_FALSE(v.innermost_saved().has_value());
  CHECK(v.value() == 3);
}

TEST_CASE("shard: a world of one count per rank, this rank's count, and of_indices is one rank of real samples") {
  const ddp::shard s{{5, 1, 9, 5}, {4, 3, 3}, 2, true};
  CHECK(s.world() == 3);
  CHECK(s.real_count() == 3);
  CHECK(s.keep_partial_batch);
  const ddp::shard outside{{}, {1, 1}, 2, false};
  CHECK_THROWS_AS((void)outside.real_count(), std::out_of_range);  // a rank outside its world

  const auto all = ddp::shard::of_indices({3, 1, 2});
  CHECK(all.indices == std::vector<std::size_t>{3, 1, 2});
  CHECK(all.world() == 1);
  CHECK(all.rank == 0);
  CHECK(all.real_count() == 3);  // every index a real sample
  CHECK_FALSE(all.keep_partial_batch);
  CHECK(ddp::shard::of_indices({}, true).keep_partial_batch);
  CHECK(ddp::shard::of_indices({}, true).real_count() == 0);
}

TEST_CASE("sample_weights: the divisor is the step's weight per rank, the total this rank's weights") {
  // 10 samples over 3 ranks, pad: this rank holds 3 real samples and one repeat; 10 real in the step.
  const ddp::sample_weights w{{1, 1, 1, 0}, 10.0, 3};
  CHECK(w.total() == 3.0);
  CHECK(w.divisor() == doctest::Approx(10.0 / 3));
  // A rank's weighted sum divided by divisor(), averaged over ranks, is the mean over the real samples.
  const std::array<double, 3> loss_sums{6.0, 3.0, 1.0};  // any per-rank weighted sums
  double averaged = 0.0;
  for (double s : loss_sums) averaged += s / w.divisor() / 3.0;
  CHECK(averaged == doctest::Approx((6.0 + 3.0 + 1.0) / 10.0));

  const ddp::sample_weights one;  // defaults: one rank, nothing counted yet
  CHECK(one.world == 1);
  CHECK(one.total() == 0.0);
}

TEST_CASE("segment: count floats at tensor are the bucket's floats from offset on, and a default one is empty") {
  const ddp::segment none;
  CHECK(none.tensor == nullptr);
  CHECK(none.count == 0);
  CHECK(none.offset == 0);
  std::array<float, 3> t{1, 2, 3};
  const ddp::segment s{t.data(), 8, t.size()};  // in that order: tensor, offset, count
  CHECK(s.tensor == t.data());
  CHECK(s.offset == 8);
  CHECK(s.count == 3);
}

TEST_CASE("device_id: cpu and cuda ordinals compare and print as the errors name them") {
  CHECK(ddp::device_id{} == ddp::device_id::cpu());
  CHECK(ddp::device_id::cuda(1) == ddp::device_id::cuda(1));
  CHECK(ddp::device_id::cuda(0) != ddp::device_id::cuda(1));
  CHECK(ddp::device_id::cuda(0) != ddp::device_id::cpu());
  CHECK(ddp::device_id::cpu().to_string() == "cpu");
  CHECK(ddp::device_id::cuda(3).to_string() == "cuda:3");
}

TEST_CASE("tensor_ref: element count and bytes from the shape, typed views that refuse another type") {
  CHECK(ddp::to_string(ddp::shape_t{2, 3}) == "[2,3]");
  CHECK(ddp::to_string(ddp::shape_t{}) == "[]");

  std::vector<double> storage(6, 1.5);
  const auto t = ddp::make_tensor_ref(std::span<double>(storage), {2, 3});
  CHECK(t.type == ddp::dtype::f64);
  CHECK(t.device == ddp::device_id::cpu());
  CHECK(t.numel() == 6);
  CHECK(t.bytes() == 48);
  const auto view = t.as<double>();
  CHECK(view.data() == storage.data());
  CHECK(view.size() == 6);
  CHECK_THROWS_WITH_AS((void)t.as<float>(), "ddp: tensor holds f64, not f32", std::invalid_argument);

  const std::vector<float> c(4);
  const auto on_gpu = ddp::make_tensor_ref(std::span<const float>(c), {4}, ddp::device_id::cuda(1));
  CHECK(on_gpu.type == ddp::dtype::f32);
  CHECK(on_gpu.device == ddp::device_id::cuda(1));

  ddp::tensor_ref scalar{storage.data(), ddp::dtype::f64, {}};
  CHECK(scalar.numel() == 1);  // no dimensions: one element
  ddp::tensor_ref empty{storage.data(), ddp::dtype::f64, {4, 0}};
  CHECK(empty.numel() == 0);
  CHECK(empty.bytes() == 0);
}

TEST_CASE("buffers: a span becomes a typed element range, counted in elements, sized in bytes") {
  std::vector<std::int64_t> v(5);
  const ddp::mutable_buffer m = ddp::as_buffer(std::span<std::int64_t>(v));
  CHECK(m.data == v.data());
  CHECK(m.count == 5);
  CHECK(m.type == ddp::dtype::i64);
  CHECK(m.bytes() == 40);
  const ddp::const_buffer c = m;  // a mutable range reads as a const one
  CHECK(c.data == v.data());
  CHECK(c.count == 5);
  CHECK(c.type == ddp::dtype::i64);

  const std::vector<std::uint8_t> bytes(3);
  const auto cb = ddp::as_buffer(std::span<const std::uint8_t>(bytes));
  static_assert(std::is_same_v<decltype(cb), const ddp::const_buffer>);
  CHECK(cb.bytes() == 3);
  CHECK(cb.type == ddp::dtype::u8);
}

TEST_CASE("ready_sink forwards each report to the callable it was made from, and a default one ignores them") {
  std::vector<std::size_t> reported;
  auto record = [&](std::size_t i) { reported.push_back(i); };
  const ddp::ready_sink sink(record);
  sink(3);
  sink(0);
  CHECK(reported == std::vector<std::size_t>{3, 0});
  const ddp::ready_sink ignore;
  ignore(7);  // no callable: nothing happens
  CHECK(reported.size() == 2);
}

TEST_CASE("issue modes: asynchronous and blocking are the two tags the concept accepts") {
  static_assert(ddp::issue_mode<ddp::asynchronous_t>);
  static_assert(ddp::issue_mode<ddp::blocking_t>);
  static_assert(!ddp::issue_mode<int>);
  static_assert(!ddp::issue_mode<const ddp::blocking_t&>);
  CHECK(ddp::issue_mode<std::remove_cvref_t<decltype(ddp::blocking)>>);
  CHECK(ddp::issue_mode<std::remove_cvref_t<decltype(ddp::asynchronous)>>);
}

TEST_CASE("spin_until: true as soon as the condition holds, false once the budget is spent") {
  using namespace std::chrono;
  int calls = 0;
  CHECK(ddp::detail::spin_until([&] { return ++calls == 3; }));
  CHECK(calls == 3);

  // A spin for a core ends early when the cores are busy (its yields give the core away); one
  // until an event spends its whole budget.
  CHECK_FALSE(ddp::detail::spin_until([] { return false; }, microseconds(500), ddp::detail::spin_kind::for_core));
  const auto t0 = steady_clock::now();
  CHECK_FALSE(ddp::detail::spin_until([] { return false; }, microseconds(500), ddp::detail::spin_kind::until));
  CHECK(steady_clock::now() - t0 >= microseconds(500));

  std::atomic<bool> flag{false};
  std::thread setter([&] { flag.store(true); });
  const bool seen = ddp::detail::spin_until([&] { return flag.load(); }, seconds(10), ddp::detail::spin_kind::until);
  setter.join();
  CHECK(seen);

  // A long spin only where each of the ranks has a core of its own.
  const int cores = ddp::detail::usable_cores();
  CHECK(cores >= 1);
  CHECK(ddp::detail::spin_budget_for(1) == ddp::detail::spin_budget);
  CHECK(ddp::detail::spin_budget_for(cores + 1) == ddp::detail::spin_budget);
  if (cores >= 2) CHECK(ddp::detail::spin_budget_for(2) == ddp::detail::dedicated_core_spin_budget);
}

TEST_CASE("cpu affinity: a thread binds to a CPU it may use, and one it may not use is an error naming rank and CPU") {
  const auto cpus = ddp::detail::usable_cpus();
#if defined(__linux__)
  REQUIRE_FALSE(cpus.empty());
  CHECK(ddp::detail::usable_cores() == static_cast<int>(cpus.size()));
  // On threads of their own, so this one keeps its mask.
  std::thread([&] {
    ddp::detail::bind_this_thread(cpus.back(), "test", 0);
    CHECK(ddp::detail::usable_cpus() == std::vector<int>{cpus.back()});
  }).join();
  int unusable = -1;
  for (int cpu = CPU_SETSIZE - 1; cpu >= 0 && unusable < 0; --cpu)
    if (std::find(cpus.begin(), cpus.end(), cpu) == cpus.end()) unusable = cpu;
  if (unusable >= 0) {
    std::string message;
    std::thread([&] {
      try {
        ddp::detail::bind_this_thread(unusable, "test", 3);
      } catch (const ddp::error& e) {
        message = e.what();
      }
    }).join();
    CHECK(message.starts_with("ddp[test] bind on rank 3: cannot bind rank 3's thread to CPU " +
                              std::to_string(unusable) + ": "));
    CHECK(message.find("allow that CPU (taskset, cpuset) or run without binding") != std::string::npos);
  }
#else
  CHECK(cpus.empty());
#endif
}

}  // namespace core_test
