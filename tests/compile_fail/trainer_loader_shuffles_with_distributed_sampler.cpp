// expect: this loader shuffles on its own, but the trainer's distributed sampler
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
// PyTorch's DataLoader(shuffle=True) beside a DistributedSampler (pitfall P4).
struct shuffling_loader {
  static constexpr bool shuffles_itself = true;
  std::size_t dataset_size() const { return 10; }
  std::vector<int> batches(const std::vector<std::size_t>&) const { return {}; }
};
void epoch(ddp::trainer<model>& t, shuffling_loader& l) { t.epoch(l); }
int main() {}
