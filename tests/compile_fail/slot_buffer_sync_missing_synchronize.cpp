// expect: a policy in the buffer_sync slot lacks `void synchronize\(ddp::buffer_sync::context&\)`
#include <ddp/ddp.hpp>

#include "support/minimal_module.hpp"

// Fills the slot but only half models it: a tag with no behaviour is never read as a default.
struct half_sync {
  using slot = ddp::buffer_sync::slot;
  static constexpr std::string_view name = "half_sync";
  void before_forward(ddp::buffer_sync::context&) {}
};
static_assert(sizeof(ddp::trainer<test::minimal_module, half_sync>) > 0);
int main() {}
