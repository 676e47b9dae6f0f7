// expect: a policy in the reduction slot lacks `static constexpr std::size_t virtual_shards`
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

struct exact_please {
  using slot = ddp::reduction::slot;
  static constexpr std::string_view name = "exact_please";
};

int main() { test::build_and_step<ddp::trainer<test::minimal_module, exact_please>>(); }
