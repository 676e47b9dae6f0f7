// expect: every layer must work on one matrix type
#include <ddp/nn/cuda/linear.hpp>
#include <ddp/nn/relu.hpp>
#include <ddp/nn/sequential.hpp>

// A GPU linear followed by a host relu: activations would have to cross between GPU and host.
using model = ddp::nn::sequential<ddp::nn::cuda::linear, ddp::nn::relu>;
static_assert(sizeof(model) > 0);
int main() {}
