// ddp::nn: a reference layer, whose forward runs OpenBLAS's SGEMM.
#include <ddp/nn/linear.hpp>

#include <string>

std::string uses_nn() {
  ddp::nn::linear layer(4, 3, 7);
  ddp::nn::matrix x(2, 4);
  for (auto& v : x.data) v = 1.0f;
  const auto y = layer.forward(x, /*training=*/false);
  return y.rows == 2 && y.cols == 3 ? "ok: ddp::nn linear 4 -> 3 through CBLAS" : "ddp::nn gave the wrong shape";
}
