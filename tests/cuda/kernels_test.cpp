// The CUDA device: the device conformance suite (tests/conformance/device_suite.hpp, shared with
// the host device and checked against references of its own, not against the host device), then
// what is CUDA's own: cuBLAS's int sizes. The suite's many-segment case covers more segments than
// one launch holds (ddp/cuda/segment_table.hpp); a user's optimizer kernel is instantiated in
// tests/cuda/user_optimizer.cu.
#include <doctest/doctest.h>

#include <cstddef>

#include "conformance/device_suite.hpp"
#include "ddp/cuda/blas.hpp"
#include "ddp/cuda/device.hpp"
#include "ddp/cuda/linalg.hpp"
#include "ddp/nn/cuda/attention_softmax.hpp"

DDP_DEVICE_CONFORMANCE_SUITE("cuda device: ", ddp::cuda::device)

// Needs no GPU: the size check runs before cuBLAS is called.
TEST_CASE("cuBLAS sizes past its int range are an error naming the dimension and the device") {
  CHECK(ddp::cuda::blas::blas_int(2147483647, "m", {0, 0}) == 2147483647);
  CHECK_THROWS_WITH(ddp::cuda::blas::blas_int(std::size_t{2147483648}, "k", {3, 1}),
                    doctest::Contains("k = 2147483648 exceeds cuBLAS's int sizes (2^31 - 1) on device 1"));
}
