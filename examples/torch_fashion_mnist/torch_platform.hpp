#pragma once
// The example with a model written in libtorch: a small CNN (two conv + batch norm + pool blocks,
// dropout, two linear layers) as a ddp::torch::module, trained through the same flags, loop and
// summary as the MLP (examples/fashion_mnist). Autograd does the backward; the loss is libtorch's
// cross-entropy, weighted so the sampler's padding counts for nothing.
#include <torch/torch.h>

#include <cstdint>
#include <span>

#include "ddp/core/sample_weights.hpp"
#include "ddp/host/device.hpp"
#include "ddp/nn/blas.hpp"
#include "ddp/nn/cross_entropy.hpp"
#include "ddp/nn/matrix.hpp"
#include "ddp/torch/allocator.hpp"
#include "ddp/torch/module.hpp"
#include "ddp/torch/seed.hpp"

namespace fmnist {

struct cnnImpl : torch::nn::Module {
  cnnImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1).bias(false)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1).bias(false)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(32))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(64))),
        dropout(register_module("dropout", torch::nn::Dropout(0.25))),
        fc1(register_module("fc1", torch::nn::Linear(64 * 7 * 7, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::max_pool2d(torch::relu(bn1(conv1(x.view({-1, 1, 28, 28})))), 2);  // 32 x 14 x 14
    h = torch::max_pool2d(torch::relu(bn2(conv2(h))), 2);                              // 64 x 7 x 7
    return fc2(dropout(torch::relu(fc1(h.flatten(1)))));
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::BatchNorm2d bn1, bn2;
  torch::nn::Dropout dropout;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(cnn);

// The reference layers' result, over a tensor: `grad` is the loss tensor itself, from which
// replica.backward(grad) runs autograd.
using torch_loss = ddp::nn::basic_cross_entropy_result<torch::Tensor>;

struct torch_platform {
  static constexpr const char* name = "cpu (libtorch)";
  using device = ddp::host::device;
  using model = ddp::torch::module<cnn>;
  template <class Launcher>
  using communicator = Launcher;

  static model make_model(device&, std::uint64_t seed) {
    return model(ddp::torch::build_seeded(seed, [] { return cnn(); }));
  }
  // The batch's pixels, as a tensor over the batch's own memory (it outlives the step).
  static torch::Tensor input(device&, const ddp::nn::matrix& x) {
    return torch::from_blob(const_cast<float*>(x.data.data()),
                            {static_cast<std::int64_t>(x.rows), static_cast<std::int64_t>(x.cols)});
  }
  static torch_loss loss(device&, const torch::Tensor& logits, std::span<const std::int32_t> labels,
                         const ddp::sample_weights& weights) {
    const auto n = static_cast<std::int64_t>(labels.size());
    const auto y = torch::from_blob(const_cast<std::int32_t*>(labels.data()), {n}, torch::kInt).to(torch::kLong);
    const auto w = torch::from_blob(const_cast<float*>(weights.per_sample.data()), {n});
    const auto per_sample = torch::nn::functional::cross_entropy(
        logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    torch_loss out;
    out.grad = (per_sample * w).sum() / weights.divisor();
    out.loss = out.grad.item<double>();
    out.loss_sum = (per_sample.detach() * w).sum().item<double>();
    out.samples = weights.total();
    out.correct = static_cast<std::size_t>((logits.detach().argmax(1).eq(y) & w.gt(0)).sum().item<std::int64_t>());
    return out;
  }
  // One intra-op thread per rank: the ranks are the parallelism. Debian's libtorch calls OpenBLAS
  // for its linear layers, whose idle pool would spin in sched_yield beside the ranks (a fifth
  // of the CPU time of an epoch here): one thread for it too. Freed tensors stay in the process
  // (ddp/torch/allocator.hpp): in-process ranks went from 1675 to 2022 samples/s (docs/torch.md).
  template <class Launcher, class Config, class F>
  static void on_rank(Launcher& launcher, const Config&, F&& f) {
    ddp::torch::retain_freed_memory();
    torch::set_num_threads(1);
    ddp::nn::blas::use_one_thread_per_rank();
    device dev;
    f(launcher, dev);
  }
};

}  // namespace fmnist
