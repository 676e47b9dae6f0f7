// expect: a policy in the bucket_cap slot lacks `ddp::bucket_plan plan
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

struct cap_only {
  using slot = ddp::buckets::slot;
  static constexpr std::string_view name = "cap_only";
  static constexpr std::size_t bytes = 1 << 20;
  std::string describe() const { return "1 MiB"; }
};
int main() { test::build_and_step<ddp::trainer<test::minimal_module, cap_only>>(); }
