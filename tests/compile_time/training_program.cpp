// A user's training program in one translation unit, as a researcher writes it outside this
// repository: a pre-norm residual MLP (layer_norm, gelu, a residual branch, batch_norm) on
// Fashion-MNIST, AdamW with parameter groups, gradient clipping, warm-up then cosine, the test
// accuracy and a checkpoint (resumed when present) after every epoch, on in-process ranks; built
// with TRAINING_PROGRAM_WITH_MPI=1 the same run also goes under mpirun (a second trainer type in
// the unit). docs/headers.md ("Compile time of a training program") times this file.
//
//   training_program [--ranks N] [--epochs E] [--samples N] [--checkpoint DIR] [--data-dir DIR]
//   mpirun -np 2 training_program_mpi --mpi ...
#include <ddp/ddp.hpp>
#include <ddp/data/fashion_mnist.hpp>
#include <ddp/data/loader.hpp>
#include <ddp/nn/batch_norm.hpp>
#include <ddp/nn/cross_entropy.hpp>
#include <ddp/nn/gelu.hpp>
#include <ddp/nn/layer_norm.hpp>
#include <ddp/nn/linear.hpp>
#include <ddp/nn/relu.hpp>
#include <ddp/nn/residual.hpp>
#include <ddp/nn/sequential.hpp>
#include <ddp/optim/adamw.hpp>
#if TRAINING_PROGRAM_WITH_MPI
#include <ddp/mpi/communicator.hpp>
#include <ddp/mpi/environment.hpp>
#endif

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

namespace {

using ddp::data::fashion_mnist;
namespace nn = ddp::nn;

struct options {
  int ranks = 2;
  int epochs = 2;
  std::size_t samples = 0;  // train on the first this many training images (0: all)
  std::size_t batch = 64;  // per rank
  float lr = 1e-3f;
  std::uint64_t seed = 1;
  std::string checkpoint;
  std::string data_dir = std::string(fashion_mnist::default_directory);
  bool mpi = false;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(std::string(flag) + " needs a value");
      return argv[++i];
    };
    if (flag == "--ranks") o.ranks = std::stoi(value());
    else if (flag == "--epochs") o.epochs = std::stoi(value());
    else if (flag == "--samples") o.samples = std::stoul(value());
    else if (flag == "--batch") o.batch = std::stoul(value());
    else if (flag == "--lr") o.lr = std::stof(value());
    else if (flag == "--seed") o.seed = std::stoull(value());
    else if (flag == "--checkpoint") o.checkpoint = value();
    else if (flag == "--data-dir") o.data_dir = value();
    else if (flag == "--mpi") o.mpi = true;
    else throw std::invalid_argument("unknown flag " + std::string(flag));
  }
  return o;
}

// The first n examples of a data set (a quick run on part of the training images).
template <class Dataset>
struct first_n {
  using example_type = typename Dataset::example_type;
  const Dataset* data;
  std::size_t n;
  std::size_t size() const { return n ? std::min(n, data->size()) : data->size(); }
  example_type get(std::size_t i) const { return data->get(i); }
};

// 784 -> 256, two pre-norm residual blocks x + W2 gelu(W1 layer_norm(x)), batch_norm, 256 -> 10.
using model = nn::sequential<nn::linear, nn::residual<nn::layer_norm, nn::linear, nn::gelu, nn::linear>,
                             nn::residual<nn::layer_norm, nn::linear, nn::gelu, nn::linear>, nn::batch_norm, nn::relu,
                             nn::linear>;

model make_model(std::uint64_t seed) {
  auto block = [](std::uint64_t s) {
    return nn::residual(nn::layer_norm(256), nn::linear(256, 512, s), nn::gelu(), nn::linear(512, 256, s + 1));
  };
  return model(nn::linear(784, 256, seed), block(seed + 1), block(seed + 3), nn::batch_norm(256), nn::relu(),
               nn::linear(256, 10, seed + 5));
}

// One rank's run, the same for every communicator.
template <class Comm>
void train(Comm& comm, const options& o, const fashion_mnist& train_set, const fashion_mnist& test_set) {
  using trainer_type = ddp::trainer<model, ddp::optim::adamw, ddp::use_communicator<Comm>>;
  const bool lead = comm.rank() == 0;
  ddp::host::device dev;
  model m = make_model(o.seed);
  trainer_type trainer(m, comm, dev, ddp::optim::adamw{.lr = o.lr, .weight_decay = 0.05f}, {.seed = o.seed});
  trainer.set_parameter_group(ddp::optim::name_ends_with({".bias"}), {.weight_decay = 0.0f});
  trainer.set_parameter_group([](std::string_view n) { return n.starts_with("0."); }, {.lr_scale = 0.5f});
  trainer.clip_gradient_norm(1.0f);

  const first_n<fashion_mnist> train_part{&train_set, o.samples};
  const ddp::data::loader loader(train_part, o.batch, &fashion_mnist::collate);
  const ddp::data::loader test_loader(test_set, 500, &fashion_mnist::collate);
  const std::size_t steps_per_epoch = trainer.steps_per_epoch(train_part.size(), o.batch);
  const std::size_t total = steps_per_epoch * static_cast<std::size_t>(o.epochs);
  const auto schedule = ddp::optim::schedule::linear_warmup(total / 10, ddp::optim::schedule::cosine(total));

  if (!o.checkpoint.empty() && ddp::has_checkpoint(o.checkpoint)) {
    trainer.load(o.checkpoint);
    if (lead) std::printf("resumed at step %llu\n", static_cast<unsigned long long>(trainer.steps()));
  }
  ddp::progress progress(comm.rank(), {.epochs = static_cast<std::size_t>(o.epochs), .steps_per_epoch = steps_per_epoch,
                                       .samples_per_step = o.batch * static_cast<std::size_t>(comm.size()),
                                       .first_step = trainer.steps()});
  for (auto epoch = trainer.epochs_started(); epoch < static_cast<std::uint64_t>(o.epochs); ++epoch) {
    ddp::metric loss, correct;
    for (const auto& b : trainer.epoch(loader)) {
      trainer.learning_rate() = o.lr * schedule(trainer.steps());
      trainer.step([&](auto& replica) {
        const auto ce = nn::softmax_cross_entropy(replica.forward(b.x), b.y, b.weights);
        replica.backward(ce.grad);
        loss.add(ce.loss_sum, ce.samples);
        correct.add(static_cast<double>(ce.correct), ce.samples);
      });
      progress.step(loss.mean());
    }
    const auto train_metrics = trainer.reduce(std::array<ddp::metric, 2>{loss, correct});
    const ddp::metric accuracy = trainer.evaluate(test_loader, [&](const auto& b) {
      const auto ce = nn::softmax_cross_entropy(trainer.module().forward(b.x), b.y, b.weights);
      return ddp::metric{static_cast<double>(ce.correct), ce.samples};
    });
    if (lead)
      std::printf("epoch %llu: train loss %.4f, train accuracy %.2f%%, test accuracy %.2f%%, gradient norm %.3f\n",
                  static_cast<unsigned long long>(epoch + 1), train_metrics[0].mean(), 100 * train_metrics[1].mean(),
                  100 * accuracy.mean(), static_cast<double>(trainer.gradient_norm()));
    if (!o.checkpoint.empty())
      trainer.save(o.checkpoint, {.keep_last = 2, .metric = accuracy.mean(), .keep_best = 1, .lower_is_better = false});
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
#if TRAINING_PROGRAM_WITH_MPI
    if (o.mpi) {
      ddp::mpi::environment env(&argc, &argv);
      ddp::mpi::communicator comm;
      const auto train_set = fashion_mnist::load(fashion_mnist::split::train, o.data_dir);
      const auto test_set = fashion_mnist::load(fashion_mnist::split::test, o.data_dir);
      train(comm, o, train_set, test_set);
      return 0;
    }
#endif
    const auto train_set = fashion_mnist::load(fashion_mnist::split::train, o.data_dir);
    const auto test_set = fashion_mnist::load(fashion_mnist::split::test, o.data_dir);
    ddp::inproc::launch(o.ranks, [&](ddp::inproc::communicator& comm) { train(comm, o, train_set, test_set); });
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "training_program: %s\n", e.what());
    return 1;
  }
}
