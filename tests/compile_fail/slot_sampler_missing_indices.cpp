// expect: a policy in the sampler slot lacks `std::vector<std::size_t> indices
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

struct no_indices {
  using slot = ddp::sampler::slot;
  static constexpr std::string_view name = "no_indices";
  static constexpr bool is_distributed = false;
  static std::size_t per_rank(std::size_t n, int world) { return n / static_cast<std::size_t>(world); }
};
int main() { test::build_and_step<ddp::trainer<test::minimal_module, no_indices>>(); }
