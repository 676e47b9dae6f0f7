// expect: a policy in the comm_hook slot lacks `void finish\(ddp::comm_hook::bucket_io&\)`
#include <ddp/ddp.hpp>

#include "support/minimal_module.hpp"

struct no_finish {
  using slot = ddp::comm_hook::slot;
  static constexpr std::string_view name = "no_finish";
  void reduce(ddp::comm_hook::bucket_io& b) { b.reduce_gradients(); }
};
static_assert(sizeof(ddp::trainer<test::minimal_module, no_finish>) > 0);
int main() {}
