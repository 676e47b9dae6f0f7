#pragma once
// Small torch::nn modules for the ddp::torch tests.
#include <torch/torch.h>

#include <vector>

#include "ddp/torch/seed.hpp"

namespace torch_test {

inline constexpr std::int64_t in_features = 6, classes = 3;

// y = x * weight + bias per feature, with a buffer tracking the running mean of its input (as
// BatchNorm's running statistics, but the output does not depend on the batch: N ranks equal one
// process on the global batch exactly, while every buffer-sync policy has a real buffer).
struct tracked_affineImpl : torch::nn::Module {
  explicit tracked_affineImpl(std::int64_t f)
      : weight(register_parameter("weight", torch::ones({f}))),
        bias(register_parameter("bias", torch::zeros({f}))),
        running_mean(register_buffer("running_mean", torch::zeros({f}))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    if (is_training()) {
      torch::NoGradGuard no_grad;
      running_mean.mul_(0.9).add_(x.mean(0), 0.1);
    }
    return x * weight + bias;
  }
  torch::Tensor weight, bias, running_mean;
};
TORCH_MODULE(tracked_affine);

// in -> 16 -> tracked_affine -> relu -> classes, and an optional auxiliary head (pitfall P2).
struct netImpl : torch::nn::Module {
  explicit netImpl(bool with_aux = true)
      : fc1(register_module("fc1", torch::nn::Linear(in_features, 16))),
        track(register_module("track", tracked_affine(16))),
        head(register_module("head", torch::nn::Linear(16, classes))) {
    if (with_aux) aux = register_module("aux", torch::nn::Linear(in_features, classes));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = head(torch::relu(track(fc1(x))));
    if (use_aux && aux) y = y + aux(x);
    return y;
  }
  torch::nn::Linear fc1;
  tracked_affine track;
  torch::nn::Linear head;
  torch::nn::Linear aux{nullptr};
  bool use_aux = true;
};
TORCH_MODULE(net);

inline net make_net(std::uint64_t seed, bool with_aux = true) {
  return ddp::torch::build_seeded(seed, [&] { return net(with_aux); });
}

// The toy problem of the host tests: the class is the arg-max of fixed projections of x.
struct batch {
  torch::Tensor x, y;
};
inline batch make_batch(std::int64_t n, std::uint64_t seed) {
  auto gen = torch::make_generator<torch::CPUGeneratorImpl>(seed);
  auto x = torch::rand({n, in_features}, gen) * 4 - 2;
  auto w = torch::arange(in_features * classes, torch::kFloat).reshape({in_features, classes}).remainder(7) - 3;
  return {x, (x.matmul(w)).argmax(1)};
}

// A tensor's elements, and every parameter's of a net in parameters() order: what the tests compare.
inline std::vector<float> floats(const torch::Tensor& t) {
  const auto c = t.detach().contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}
template <class Net>
std::vector<std::vector<float>> values(Net& n) {
  std::vector<std::vector<float>> out;
  for (auto& p : n->parameters()) out.push_back(floats(p));
  return out;
}

}  // namespace torch_test
