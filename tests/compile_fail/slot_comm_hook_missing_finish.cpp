// expect: a policy in the comm_hook slot lacks `void finish\(ddp::comm_hook::bucket_io&\)`
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

struct no_finish {
  using slot = ddp::comm_hook::slot;
  static constexpr std::string_view name = "no_finish";
  void reduce(ddp::comm_hook::bucket_io& b) { b.reduce_gradients(); }
};
int main() { test::build_and_step<ddp::trainer<test::minimal_module, no_finish>>(); }
