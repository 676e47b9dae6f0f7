// expect: has no `using slot = ...;`, so it fills no slot
#include <ddp/policy/buffer_sync.hpp>
#include <ddp/policy/slots.hpp>

struct not_a_policy {};
using slots = ddp::policy::slot_list<ddp::buffer_sync::slot>;
static_assert(ddp::policy::resolve<slots, ddp::buffer_sync::none, not_a_policy>::valid);
int main() {}
