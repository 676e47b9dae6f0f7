// [doc: install.md]
#include <ddp/data/fashion_mnist.hpp>  // ddp::data
#include <ddp/ddp.hpp>                 // ddp::ddp
#include <ddp/nn/linear.hpp>           // ddp::nn

#include <cstdio>
#include <span>
#include <vector>

int main() {
  // Two in-process ranks add up their vectors: every rank holds 1 + 2.
  auto sums = ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) {
    std::vector<float> v(4, static_cast<float>(comm.rank() + 1));
    ddp::comm::all_reduce(comm, std::span<float>(v), ddp::reduce_op::sum);
    return v[0];
  });
  ddp::nn::linear layer(784, 10, /*seed=*/1);  // its forward is an OpenBLAS SGEMM
  const auto y = layer.forward(ddp::nn::matrix(2, 784), /*training=*/false);
  try {
    const auto test = ddp::data::fashion_mnist::load(ddp::data::fashion_mnist::split::test);
    std::printf("Fashion-MNIST: %zu test images\n", test.size());
  } catch (const ddp::error& e) {  // names the missing file and the package that has it
    std::printf("%s\n", e.what());
  }
  std::printf("all_reduce over 2 ranks: %g and %g; linear 784 -> 10 gave %zu x %zu\n", sums[0], sums[1], y.rows,
              y.cols);
  return sums == std::vector<float>{3.0f, 3.0f} ? 0 : 1;
}
// [end doc]
