// expect: a policy in the buffer_sync slot lacks `void synchronize\(ddp::buffer_sync::context&\)`
// errors: 1
#include <ddp/ddp.hpp>

#include "support/build_and_step.hpp"

// Fills the slot but only half models it: a tag with no behaviour is never read as a default.
struct half_sync {
  using slot = ddp::buffer_sync::slot;
  static constexpr std::string_view name = "half_sync";
  void before_forward(ddp::buffer_sync::context&) {}
};
int main() { test::build_and_step<ddp::trainer<test::minimal_module, half_sync>>(); }
