// The snippet of docs/torch.md, compiled when libtorch is found.
#include <torch/torch.h>

#include <ddp/data/fashion_mnist.hpp>
#include <ddp/data/loader.hpp>
#include <ddp/ddp.hpp>
#include <ddp/optim/external.hpp>
#include <ddp/torch/module.hpp>
#include <ddp/torch/seed.hpp>

namespace snippets {

struct MyNetImpl : torch::nn::Module {
  MyNetImpl() : fc(register_module("fc", torch::nn::Linear(784, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc(x); }
  torch::nn::Linear fc;
};
TORCH_MODULE(MyNet);

using loader_type = ddp::data::loader<ddp::data::fashion_mnist, decltype(&ddp::data::fashion_mnist::collate)>;

void adopt(const loader_type& loader) {
  // [doc: torch.md]
  #include <ddp/ddp.hpp>
  #include <ddp/torch/module.hpp>
  #include <ddp/torch/seed.hpp>

  // A batch of the Fashion-MNIST loader as tensors over its memory.
  auto images = [](const auto& b) {
    return torch::from_blob(const_cast<float*>(b.x.data.data()), {std::int64_t(b.x.rows), std::int64_t(b.x.cols)});
  };
  auto labels = [](const auto& b) {
    return torch::tensor(std::vector<std::int64_t>(b.y.begin(), b.y.end()));
  };
  ddp::inproc::launch(2, [&](ddp::inproc::communicator& comm) {   // or ddp::mpi::communicator under mpirun
    torch::set_num_threads(1);                                    // the ranks are the parallelism
    ddp::torch::module model(ddp::torch::build_seeded(1, [] { return MyNet(); }));  // any torch::nn::Module
    ddp::host::device dev;                                        // rank 0's weights reach every rank (P6)
    ddp::trainer<decltype(model)> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.1f, .momentum = 0.9f});
    for (const auto& b : trainer.epoch(loader))                   // the sampler shards and shuffles (P4)
      trainer.step([&](auto& replica) {
        replica.backward(torch::nn::functional::cross_entropy(replica.forward(images(b)), labels(b)));
      });
  });
  // [end doc]
}

void keep_a_torch_optimizer(MyNet net, ddp::inproc::communicator& comm, ddp::host::device& dev,
                            const torch::Tensor& x, const torch::Tensor& y) {
  ddp::torch::module model(net);
  // [doc: torch.md]
  #include <ddp/ddp.hpp>
  #include <ddp/optim/external.hpp>
  #include <ddp/torch/module.hpp>

  ddp::trainer<decltype(model), ddp::optim::external> trainer(model, comm, dev);
  torch::optim::Adam adam(net->parameters(), 1e-3);
  trainer.step([&](auto& r) { r.backward(torch::nn::functional::cross_entropy(r.forward(x), y)); });
  adam.step();
  adam.zero_grad();
  // [end doc]
}

void shard_a_sequential(ddp::inproc::communicator& comm, ddp::host::device& dev, const torch::Tensor& x,
                        const torch::Tensor& y) {
  // [doc: torch.md]
  #include <ddp/ddp.hpp>
  #include <ddp/torch/module.hpp>
  #include <ddp/torch/seed.hpp>

  auto net = ddp::torch::build_seeded(1, [] {
    return torch::nn::Sequential(torch::nn::Linear(784, 512), torch::nn::ReLU(), torch::nn::Linear(512, 512),
                                 torch::nn::ReLU(), torch::nn::Linear(512, 10));
  });
  ddp::torch::module model(net);
  // ZeRO-3: a rank keeps 1/N of the parameters, gradients and AdamW state; a layer's parameters
  // are gathered for its forward and again for its backward.
  ddp::trainer<decltype(model), ddp::update::fully_sharded, ddp::optim::adamw, ddp::bucket_cap<2 << 20>> trainer(
      model, comm, dev, ddp::optim::adamw{.lr = 1e-3f});
  trainer.step([&](auto& r) { r.backward(torch::nn::functional::cross_entropy(r.forward(x), y)); });
  trainer.gather_parameters();  // collective: the whole net in net->parameters() until the next step
  torch::save(net, "net.pt");
  // [end doc]
}

}  // namespace snippets
