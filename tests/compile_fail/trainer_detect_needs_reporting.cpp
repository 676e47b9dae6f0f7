// expect: need a module that reports ready gradients
#include <ddp/trainer/trainer.hpp>

#include <vector>

struct silent_module {  // never reports ready gradients
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;
  std::vector<ddp::parameter_ref> parameters() { return {}; }
  std::vector<ddp::buffer_ref> buffers() { return {}; }
  output_type forward(const input_type& x) { return x; }
  void backward(const output_type&, const ddp::ready_sink&) {}
};
static_assert(sizeof(ddp::trainer<silent_module, ddp::unused_params::detect_each_step>) > 0);
int main() {}
