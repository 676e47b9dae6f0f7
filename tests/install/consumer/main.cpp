// A program that knows ddp only through its installed package: the core, and each component
// the package provides (uses_<component>.cpp).
#include <ddp/ddp.hpp>

#include <cstdio>
#include <string>
#include <vector>

#define CONSUMER_DECLARE(name) std::string uses_##name();
CONSUMER_DECLARE(nn)
CONSUMER_DECLARE(data)
CONSUMER_DECLARE(runtime)
CONSUMER_DECLARE(mpi)
CONSUMER_DECLARE(mpi_runtime)
CONSUMER_DECLARE(cuda)
CONSUMER_DECLARE(nccl)

int main() {
  auto sums = ddp::inproc::launch(3, [](ddp::inproc::communicator& comm) {
    std::vector<int> v(5, comm.rank() + 1);
    ddp::comm::all_reduce(comm, std::span<int>(v), ddp::reduce_op::sum);
    return v[4];
  });
  for (int s : sums)
    if (s != 6) return 1;
  std::puts("consumer: all_reduce over 3 in-process ranks gave 6 on every rank");
  std::vector<std::string (*)()> components{
#if CONSUMER_WITH_NN
      &uses_nn,
#endif
#if CONSUMER_WITH_DATA
      &uses_data,
#endif
#if CONSUMER_WITH_RUNTIME
      &uses_runtime,
#endif
#if CONSUMER_WITH_MPI
      &uses_mpi,
#endif
#if CONSUMER_WITH_MPI_RUNTIME
      &uses_mpi_runtime,
#endif
#if CONSUMER_WITH_CUDA
      &uses_cuda,
#endif
#if CONSUMER_WITH_NCCL
      &uses_nccl,
#endif
  };
  for (auto* uses : components) {
    const std::string line = uses();
    std::printf("consumer: %s\n", line.c_str());
    if (line.rfind("ok", 0) != 0) return 1;
  }
  return 0;
}
