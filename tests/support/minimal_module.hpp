#pragma once
// The smallest type that models ddp::trainable_module: for concept and compile-time tests.
#include <vector>

#include "ddp/concepts/module.hpp"

namespace test {

struct minimal_module {
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;
  static constexpr bool reports_gradient_ready = true;  // it has no parameter to report
  std::vector<ddp::parameter_ref> parameters() { return {}; }
  std::vector<ddp::buffer_ref> buffers() { return {}; }
  output_type forward(const input_type& x) { return x; }
  void backward(const output_type&, const ddp::ready_sink&) {}
};

}  // namespace test
