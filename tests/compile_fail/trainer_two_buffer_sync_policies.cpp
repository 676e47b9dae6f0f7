// expect: two policies were given for one slot
#include <ddp/trainer/trainer.hpp>

#include <vector>

struct model {
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;
  std::vector<ddp::parameter_ref> parameters() { return {}; }
  std::vector<ddp::buffer_ref> buffers() { return {}; }
  output_type forward(const input_type& x) { return x; }
  void backward(const output_type&, const ddp::ready_sink&) {}
};
static_assert(sizeof(ddp::trainer<model, ddp::buffer_sync::none, ddp::optim::adamw,
                                  ddp::buffer_sync::broadcast_each_forward>) > 0);
int main() {}
