// expect: the module lacks `backward\(const output_type& grad_output, const ddp::ready_sink&\)`
#include <ddp/concepts/module.hpp>

#include <vector>

// Everything a module needs but backward.
struct no_backward {
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;
  std::vector<ddp::parameter_ref> parameters();
  std::vector<ddp::buffer_ref> buffers();
  output_type forward(const input_type& x);
};
static_assert(ddp::diagnose_module<no_backward>());
int main() {}
