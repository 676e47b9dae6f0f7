// expect: two policies were given for one slot
#include <ddp/policy/buffer_sync.hpp>
#include <ddp/policy/slots.hpp>

using slots = ddp::policy::slot_list<ddp::buffer_sync::slot>;
static_assert(ddp::policy::resolve<slots, ddp::buffer_sync::none,
                                   ddp::buffer_sync::broadcast_each_forward>::valid);
int main() {}
