// expect: the communicator and the device disagree on where memory lives
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
// A GPU-memory device beside the in-process communicator, which moves host memory.
struct gpu_like_device : ddp::host::device {
  static constexpr ddp::device_kind kind = ddp::device_kind::cuda;
};
static_assert(sizeof(ddp::trainer<model, ddp::use_device<gpu_like_device>>) > 0);
int main() {}
