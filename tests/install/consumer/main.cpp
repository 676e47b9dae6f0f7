// A program that knows ddp only through its installed package.
#include <ddp/core/collectives.hpp>
#include <ddp/inproc/launch.hpp>

#include <cstdio>
#include <vector>

int main() {
  auto sums = ddp::inproc::launch(3, [](ddp::inproc::communicator& comm) {
    std::vector<int> v(5, comm.rank() + 1);
    ddp::all_reduce(comm, std::span<int>(v), ddp::reduce_op::sum);
    return v[4];
  });
  for (int s : sums)
    if (s != 6) return 1;
  std::puts("consumer: all_reduce over 3 in-process ranks gave 6 on every rank");
  return 0;
}
