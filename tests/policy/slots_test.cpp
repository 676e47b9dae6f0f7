#include <doctest/doctest.h>

#include <type_traits>

#include "ddp/policy/bucket_cap.hpp"
#include "ddp/policy/buffer_sync.hpp"
#include "ddp/policy/slots.hpp"
#include "ddp/policy/unused_params.hpp"

namespace policy_slots_test {

namespace {
using slots = ddp::policy::slot_list<ddp::buffer_sync::slot, ddp::unused_params::slot,
                                     ddp::buckets::slot>;
template <class... Ps>
using resolved = ddp::policy::resolve<slots, Ps...>;
}  // namespace

TEST_CASE("empty slots take their defaults") {
  using r = resolved<>;
  static_assert(r::valid);
  static_assert(std::is_same_v<r::get<ddp::buffer_sync::slot>, ddp::buffer_sync::broadcast_once_per_step>);
  static_assert(std::is_same_v<r::get<ddp::unused_params::slot>, ddp::unused_params::forbid>);
  static_assert(r::get<ddp::buckets::slot>::bytes == 25u << 20);
  CHECK(r::valid);
}

TEST_CASE("policies are sorted into slots whatever their order") {
  using a = resolved<ddp::bucket_cap<1024>, ddp::unused_params::static_graph,
                     ddp::buffer_sync::none>;
  using b = resolved<ddp::buffer_sync::none, ddp::bucket_cap<1024>,
                     ddp::unused_params::static_graph>;
  static_assert(std::is_same_v<a::get<ddp::buffer_sync::slot>, b::get<ddp::buffer_sync::slot>>);
  static_assert(std::is_same_v<a::get<ddp::unused_params::slot>, ddp::unused_params::static_graph>);
  static_assert(a::get<ddp::buckets::slot>::bytes == 1024);
  CHECK(a::valid);
}

TEST_CASE("policy names print") {
  CHECK(ddp::buffer_sync::average_once_per_step::name == "average_once_per_step");
  CHECK(ddp::unused_params::detect_each_step::name == "detect_each_step");
}

TEST_CASE("a bucket cap prints in the largest unit that divides it, never as 0 KiB") {
  CHECK(ddp::bucket_cap<std::size_t{25} << 20>{}.describe() == "25 MiB");
  CHECK(ddp::bucket_cap<256 << 10>{}.describe() == "256 KiB");
  CHECK(ddp::bucket_cap<1536 << 10>{}.describe() == "1536 KiB");
  CHECK(ddp::bucket_cap<512>{}.describe() == "512 bytes");
}

}  // namespace policy_slots_test
