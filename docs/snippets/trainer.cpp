// The snippets of docs/trainer.md, docs/loaders.md, docs/choosing-policies.md, docs/benchmarking.md,
// docs/sync-schedules.md and docs/policies.md (PowerSGD, one_of), compiled.
#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <span>
#include <string>

#include "common.hpp"
#include "ddp/host/linalg.hpp"
#include "ddp/inproc/elastic.hpp"
#include "ddp/policy/powersgd.hpp"
#include "ddp/sampler/virtual_shards.hpp"

namespace snippets {

// [doc: choosing-policies.md]
#include <ddp/ddp.hpp>

using defaults = ddp::trainer<my_model, ddp::buffer_sync::broadcast_once_per_step, ddp::unused_params::forbid,
                              ddp::sampler::distributed<true, ddp::sampler::tail::pad>,
                              ddp::bucket_cap<25 << 20>, ddp::update::replicated, ddp::optim::sgd>;
// [end doc]

using trainer_t = ddp::trainer<model>;

void powersgd(model& module, ddp::inproc::communicator& comm, ddp::host::device& dev) {
  // [doc: policies.md]
  #include <ddp/ddp.hpp>
  #include <ddp/host/linalg.hpp>
  #include <ddp/policy/powersgd.hpp>

  ddp::trainer<model, ddp::comm_hook::powersgd<4>> trainer(module, comm, dev, ddp::optim::sgd{.lr = 0.1f});
  trainer.policy<ddp::comm_hook::slot>().start_after = 500;  // plain steps first
  // [end doc]
}

void diloco(model& module, ddp::inproc::communicator& comm, ddp::host::device& dev) {
  // [doc: sync-schedules.md]
  #include <ddp/ddp.hpp>

  // 32 inner AdamW steps, then DiLoCo's outer step: 1/32 of every_step's bytes.
  ddp::trainer<model, ddp::sync_schedule::diloco<32>, ddp::optim::adamw> trainer(
      module, comm, dev, ddp::optim::adamw{.lr = 1e-3f, .weight_decay = 0.1f});
  trainer.policy<ddp::sync_schedule::slot>().outer.lr = 0.5f;  // the outer optimizer is a value
  // [end doc]
}

void diloco_ending_mid_period(model& module, ddp::inproc::communicator& comm, ddp::host::device& dev,
                              const loader_type& loader) {
  ddp::trainer<model, ddp::sync_schedule::diloco<32>> trainer(module, comm, dev, ddp::optim::sgd{.lr = 0.1f});
  // [doc: sync-schedules.md]
  #include <ddp/ddp.hpp>
  #include <ddp/nn/cross_entropy.hpp>

  for (const auto& b : trainer.epoch(loader))  // an epoch of 1,000 steps: it ends 8 steps into a period
    trainer.step([&](auto& replica) {
      replica.backward(ddp::nn::softmax_cross_entropy(replica.forward(b.x), b.y, b.weights).grad);
    });
  trainer.sync_now();  // the outer step now: every rank holds the new anchor
  // [end doc]
}

struct command_line {
  std::string buffer_sync = "none", unused_params = "static_graph";
};

void choose_at_run_time(model& module, ddp::inproc::communicator& comm, ddp::host::device& dev,
                        const command_line& flags) {
  // [doc: policies.md]
  #include <ddp/ddp.hpp>

  using sync_choice = ddp::buffer_sync::one_of<ddp::buffer_sync::broadcast_once_per_step, ddp::buffer_sync::none>;
  using unused_choice = ddp::unused_params::one_of<ddp::unused_params::forbid, ddp::unused_params::static_graph>;
  ddp::trainer<model, sync_choice, unused_choice> trainer(module, comm, dev, ddp::optim::sgd{.lr = 0.1f});
  trainer.policy<ddp::buffer_sync::slot>().select(flags.buffer_sync);  // on every rank, before the first step
  trainer.policy<ddp::unused_params::slot>().select(flags.unused_params);
  // [end doc]
}

void mixed_precision(ddp::inproc::communicator& comm, ddp::host::device& dev, const fashion_mnist::batch& b) {
  // [doc: trainer.md]
  #include <ddp/ddp.hpp>

  model module = make_model(1);
  module.cast_parameters(ddp::dtype::bf16);  // the module holds bf16 values and gradients
  ddp::trainer<model, ddp::comm_hook::bf16> trainer(module, comm, dev, ddp::optim::sgd{.lr = 0.1f});
  trainer.step([&](auto& replica) {          // the optimizer updates the f32 master copy
    replica.backward(ddp::nn::softmax_cross_entropy(replica.forward(b.x), b.y).grad);
  });
  // [end doc]
}

void invariant_to_world_size(model& module, ddp::inproc::communicator& comm, ddp::host::device& dev,
                              const fashion_mnist& train_set, int epochs) {
  // [doc: reduction.md]
  #include <ddp/data/fashion_mnist.hpp>
  #include <ddp/data/loader.hpp>
  #include <ddp/ddp.hpp>
  #include <ddp/nn/cross_entropy.hpp>

  // Each step's global batch of 128 is 8 virtual shards of 16: the same bits on 1 to 8 ranks.
  ddp::trainer<model, ddp::reduction::invariant<8>> trainer(module, comm, dev, ddp::optim::sgd{.lr = 0.1f});
  ddp::data::loader loader(train_set, 128 / 8, &fashion_mnist::collate);  // a batch is one shard
  ddp::exact_metric loss;  // summed exactly: the same bits at any world size
  for (int epoch = 0; epoch < epochs; ++epoch)
    for (const auto& shards : trainer.epoch_shards(loader))  // each step: this rank's virtual shards
      trainer.step(shards, [&](auto& replica, const auto& b) {  // one micro-batch per shard
        auto ce = ddp::nn::softmax_cross_entropy(replica.forward(b.x), b.y, b.weights);
        replica.backward(ce.grad);
        loss.add(ce.loss_sum, ce.samples);
      });
  const ddp::exact_metric global = trainer.reduce(loss);
  // [end doc]
  (void)global;
}

void construction(model& module, ddp::inproc::communicator& comm, ddp::host::device& device) {
  // [doc: trainer.md]
  #include <ddp/ddp.hpp>

  ddp::trainer<model, ddp::unused_params::detect_each_step, ddp::optim::adamw> trainer(
      module, comm, device, ddp::optim::adamw{.lr = 1e-3f, .weight_decay = 0.01f}, {.seed = 1});
  // [end doc]
  (void)trainer;
}

float a_step(trainer_t& trainer, const ddp::nn::matrix& x, std::span<const std::int32_t> y) {
  // [doc: trainer.md]
  #include <ddp/ddp.hpp>
  #include <ddp/nn/cross_entropy.hpp>

  const float loss = trainer.step([&](auto& replica) {
    auto out = replica.forward(x);            // any number of forwards
    auto ce = ddp::nn::softmax_cross_entropy(out, y);
    replica.backward(ce.grad);                // one backward per forward, innermost first
    return ce.loss;                           // step returns what the function returns
  });
  // [end doc]
  return loss;
}

void accumulation(trainer_t& trainer, const std::vector<fashion_mnist::batch>& micro_batches) {
  // [doc: trainer.md]
  #include <ddp/ddp.hpp>
  #include <ddp/nn/cross_entropy.hpp>

  auto train_on = [](const fashion_mnist::batch& b) {
    return [&b](auto& replica) {
      replica.backward(ddp::nn::softmax_cross_entropy(replica.forward(b.x), b.y).grad);
    };
  };
  for (std::size_t i = 0; i + 1 < micro_batches.size(); ++i)
    trainer.accumulate(train_on(micro_batches[i]));   // no communication
  trainer.step(train_on(micro_batches.back()));       // reduce once, update
  // [end doc]
}

double evaluation(trainer_t& trainer, model& model, const fashion_mnist& test_set) {
  // [doc: trainer.md]
  #include <ddp/ddp.hpp>
  #include <ddp/data/loader.hpp>
  #include <ddp/nn/cross_entropy.hpp>

  const ddp::data::loader test_loader(test_set, 500, &fashion_mnist::collate);
  const ddp::metric accuracy = trainer.evaluate(test_loader, [&](const auto& b) {
    const auto ce = ddp::nn::softmax_cross_entropy(model.forward(b.x), b.y, b.weights);
    return ddp::metric{double(ce.correct), ce.samples};       // or a std::array of metrics
  });
  // [end doc]
  return accuracy.mean();
}

void schedules(trainer_t& trainer, std::size_t total_steps, std::size_t step, float base_lr) {
  // [doc: trainer.md]
  #include <ddp/ddp.hpp>

  const auto schedule = ddp::optim::schedule::linear_warmup(500, ddp::optim::schedule::cosine(total_steps));
  trainer.learning_rate() = base_lr * schedule(step);
  // [end doc]
}

void parameter_groups(trainer_t& trainer) {
  // [doc: trainer.md]
  #include <ddp/ddp.hpp>

  trainer.set_parameter_group(ddp::optim::name_ends_with({".bias"}), {.weight_decay = 0.0f});
  trainer.set_parameter_group([](std::string_view n) { return n.starts_with("0."); }, {.lr_scale = 0.1f});
  // [end doc]
}

void clipping(trainer_t& trainer, const fashion_mnist::batch& b) {
  // [doc: trainer.md]
  #include <ddp/ddp.hpp>

  trainer.clip_gradient_norm(1.0f);   // from the next step on; 0 turns it off
  trainer.step([&](auto& replica) {
    replica.backward(ddp::nn::softmax_cross_entropy(replica.forward(b.x), b.y).grad);
  });
  log(trainer.gradient_norm());       // this step's norm before clipping
  // [end doc]
}

void overlapped_update(trainer_t& trainer, const fashion_mnist::batch& b) {
  // [doc: trainer.md]
  #include <ddp/ddp.hpp>

  trainer.overlap_optimizer();        // between steps, on every rank alike; false turns it off
  trainer.step([&](auto& replica) {
    replica.backward(ddp::nn::softmax_cross_entropy(replica.forward(b.x), b.y).grad);
  });                                 // bucket 0 is updated while the last bucket still reduces
  // [end doc]
}

void fully_sharded(model& module, ddp::inproc::communicator& comm, ddp::host::device& dev,
                   const std::vector<fashion_mnist::batch>& my_batches) {
  // [doc: trainer.md]
  #include <ddp/ddp.hpp>

  ddp::trainer<model, ddp::update::fully_sharded, ddp::optim::adamw> trainer(module, comm, dev, {.lr = 1e-3f});
  for (const auto& b : my_batches)
    trainer.step([&](auto& replica) {
      replica.backward(ddp::nn::softmax_cross_entropy(replica.forward(b.x), b.y).grad);
    });                               // the module holds no parameter between steps
  trainer.gather_parameters();        // collective: every parameter back in the module
  log(module.layer<0>().params()[0].value()[0]);  // until the next step or release_parameters()
  // [end doc]
}

struct gan_batch {
  ddp::nn::matrix z, real;
};
using generator = ddp::nn::sequential<ddp::nn::linear, ddp::nn::relu, ddp::nn::linear>;
using discriminator = ddp::nn::sequential<ddp::nn::linear, ddp::nn::relu, ddp::nn::linear>;

void gan(generator& g, discriminator d, ddp::inproc::communicator& comm, ddp::host::device& dev,
         const ddp::optim::sgd& opt, const std::vector<gan_batch>& batches, const std::vector<std::int32_t>& ones,
         const std::vector<std::int32_t>& zeros) {
  // [doc: trainer.md]
  #include <ddp/ddp.hpp>
  #include <ddp/nn/cross_entropy.hpp>

  d.compute_input_gradient();   // d's backward returns d loss / d input
  ddp::trainer<generator> train_g(g, comm, dev, opt);
  ddp::trainer<discriminator> train_d(d, comm, dev, opt);
  for (const auto& b : batches) {
    g.eval(); auto fake = g.forward(b.z); g.train();        // no state saved for a backward
    train_d.step([&](auto& r) {                              // real: label 1, generated: label 0
      auto on_real = softmax_cross_entropy(r.forward(b.real), ones);
      auto on_fake = softmax_cross_entropy(r.forward(fake), zeros);
      r.backward(on_fake.grad);                              // forwards first, backwards innermost
      r.backward(on_real.grad);                              // first: the last one sends
    });
    train_g.step([&](auto& r) {                              // fool the discriminator
      auto out = softmax_cross_entropy(d.forward(r.forward(b.z)), ones);
      r.backward(d.backward(out.grad, ddp::ready_sink{}));   // d loss / d fake, into the generator
    });
    train_d.zero_gradients();   // the generator's pass left gradients in d (PyTorch: D.zero_grad())
  }
  // [end doc]
}

void join(trainer_t& trainer, const std::vector<fashion_mnist::batch>& my_batches) {
  // [doc: trainer.md]
  #include <ddp/ddp.hpp>

  for (const auto& b : my_batches)                                 // counts may differ per rank
    trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
  trainer.join();                                                  // every rank, after its last batch
  // [end doc]
}

void timeline(trainer_t& trainer, const std::vector<fashion_mnist::batch>& my_batches) {
  // [doc: benchmarking.md]
  #include <ddp/ddp.hpp>

  ddp::timeline timeline;                  // holds the events; outlives the recording
  trainer.record_timeline(&timeline);      // every following step's phases
  for (const auto& b : my_batches)
    trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
  trainer.record_timeline(nullptr);        // stop
  // Collective: every rank's events go to rank 0, which writes one file.
  ddp::write_chrome_trace(trainer.communicator(), trainer.device(), timeline, "trace.json");
  // [end doc]
}

void using_the_loader(trainer_t& trainer, int epochs) {
  // [doc: loaders.md]
  #include <ddp/ddp.hpp>
  #include <ddp/data/fashion_mnist.hpp>
  #include <ddp/data/loader.hpp>
  #include <ddp/nn/cross_entropy.hpp>

  const auto train_set = ddp::data::fashion_mnist::load(ddp::data::fashion_mnist::split::train);
  const ddp::data::loader loader(train_set, 64, &ddp::data::fashion_mnist::collate,
                                 ddp::data::prefetch{2});  // optional: 2 batches made ahead
  for (int epoch = 0; epoch < epochs; ++epoch)
    for (const auto& b : trainer.epoch(loader))  // this rank's share, a new order each epoch
      trainer.step([&](auto& replica) {
        auto ce = ddp::nn::softmax_cross_entropy(replica.forward(b.x), b.y, b.weights);
        replica.backward(ce.grad);
      });
  // [end doc]
}

void checkpoints(trainer_t& trainer, const loader_type& loader, const std::filesystem::path& dir,
                 std::uint64_t epochs, float base_lr, const std::function<float(std::size_t)>& schedule) {
  // [doc: checkpoints.md]
  #include <ddp/ddp.hpp>
  #include <ddp/data/loader.hpp>
  #include <ddp/nn/cross_entropy.hpp>

  if (ddp::has_checkpoint(dir)) trainer.load(dir);         // every rank; a new run starts fresh
  for (auto epoch = trainer.epochs_started(); epoch < epochs; ++epoch) {
    for (const auto& b : trainer.epoch(loader)) {           // resumes mid-epoch where it was saved
      trainer.learning_rate() = base_lr * schedule(trainer.steps());   // the schedule from the step count
      trainer.step([&](auto& r) {
        r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y, b.weights).grad);
      });
    }
    trainer.save(dir);                                      // every rank, between steps
  }
  // [end doc]
}

}  // namespace snippets

// [doc: loaders.md]
#include <ddp/data/dataset.hpp>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

// Samples in a file of fixed-size records: read one per get(), nothing kept.
class record_file {
 public:
  struct example {
    std::array<std::uint8_t, 784> image;
    std::int32_t label;
  };
  using example_type = example;
  explicit record_file(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) throw std::runtime_error("cannot open '" + path + "'");
    struct stat st {};
    ::fstat(fd_, &st);
    count_ = static_cast<std::size_t>(st.st_size) / record_bytes;
  }
  std::size_t size() const { return count_; }
  example get(std::size_t i) const {  // pread: safe from several threads at once
    std::array<std::uint8_t, record_bytes> r{};
    if (::pread(fd_, r.data(), r.size(), static_cast<off_t>(i * record_bytes)) != record_bytes)
      throw std::runtime_error("record " + std::to_string(i) + " is short");
    example e{};
    std::copy_n(r.begin(), 784, e.image.begin());
    e.label = r[784];
    return e;
  }

 private:
  static constexpr std::size_t record_bytes = 785;
  int fd_;
  std::size_t count_ = 0;
};
static_assert(ddp::data::dataset<record_file>);
// [end doc]

// [doc: loaders.md]
#include <ddp/data/loader.hpp>
#include <ddp/nn/matrix.hpp>

// Synthetic samples: 8 features and a label in [0, 4), made from the index.
struct synthetic {
  struct example {
    std::array<float, 8> x;
    std::int32_t y;
  };
  using example_type = example;
  std::size_t size() const { return 1000; }
  example get(std::size_t i) const {
    example e{};
    for (std::size_t f = 0; f < e.x.size(); ++f) e.x[f] = static_cast<float>((i * 7 + f * 3) % 11) / 11.0f;
    e.y = static_cast<std::int32_t>(i % 4);
    return e;
  }
  // Any struct: its fields are what a step reads (b.x, b.y); the loader adds b.weights.
  struct batch {
    ddp::nn::matrix x;            // one row per sample
    std::vector<std::int32_t> y;  // one label per sample
  };
  static batch collate(std::span<const example> examples) {
    batch b{ddp::nn::matrix(examples.size(), 8), std::vector<std::int32_t>(examples.size())};
    for (std::size_t r = 0; r < examples.size(); ++r) {
      std::copy(examples[r].x.begin(), examples[r].x.end(), b.x.row(r));
      b.y[r] = examples[r].y;
    }
    return b;
  }
};
static_assert(ddp::data::dataset<synthetic>);
// [end doc]

// [doc: loaders.md]
#include <ddp/concepts/loader.hpp>

// Batches of whole sequences packed from a token stream: the index picks a window.
struct packed_windows {
  static constexpr bool shuffles_itself = false;  // the trainer's sampler orders the windows
  const std::vector<std::int32_t>* tokens;
  std::size_t window, batch;
  std::size_t dataset_size() const { return tokens->size() / window; }
  std::vector<std::vector<std::int32_t>> batches(const std::vector<std::size_t>& indices) const {
    std::vector<std::vector<std::int32_t>> out;
    for (std::size_t b = 0; b + batch <= indices.size(); b += batch) {
      out.emplace_back();
      for (std::size_t i = b; i < b + batch; ++i) {
        const auto first = tokens->begin() + static_cast<std::ptrdiff_t>(indices[i] * window);
        out.back().insert(out.back().end(), first, first + static_cast<std::ptrdiff_t>(window));
      }
    }
    return out;
  }
};
static_assert(ddp::epoch_loader<packed_windows>);
// [end doc]

namespace snippets {

void keeping_checkpoints(trainer_t& trainer, model& module, const loader_type& loader, const fashion_mnist& test_set,
                         const std::filesystem::path& dir, std::uint64_t epochs) {
  // [doc: checkpoints.md]
  #include <algorithm>
  #include <ddp/ddp.hpp>
  #include <ddp/data/loader.hpp>
  #include <ddp/nn/cross_entropy.hpp>

  const ddp::data::loader test_loader(test_set, 500, &fashion_mnist::collate);
  for (auto epoch = trainer.epochs_started(); epoch < epochs; ++epoch) {
    for (const auto& b : trainer.epoch(loader))
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y, b.weights).grad); });
    const ddp::metric test_loss = trainer.evaluate(test_loader, [&](const auto& b) {  // reduced: equal on every rank
      const auto ce = ddp::nn::softmax_cross_entropy(module.forward(b.x), b.y, b.weights);
      return ddp::metric{ce.loss_sum, ce.samples};
    });
    trainer.save(dir, {.keep_last = 3, .metric = test_loss.mean(), .keep_best = 2, .lower_is_better = true});
  }
  // Later, in another run: the best of them.
  const auto kept = ddp::committed_checkpoints(dir);  // oldest save first; steps, world, metric
  const auto best = std::ranges::min_element(kept, {}, [](const ddp::checkpoint_info& c) { return *c.metric; });
  trainer.load(dir, best->steps);
  // [end doc]
}

void progress_report(trainer_t& trainer, const loader_type& loader, ddp::inproc::communicator& comm, std::size_t epochs) {
  // [doc: trainer.md]
  #include <ddp/ddp.hpp>
  #include <ddp/data/loader.hpp>
  #include <ddp/nn/cross_entropy.hpp>

  ddp::progress progress(comm.rank(), {.epochs = epochs,
                                       .steps_per_epoch = trainer.steps_per_epoch(loader.dataset_size(), 64),
                                       .samples_per_step = 64 * static_cast<std::size_t>(comm.size()),
                                       .first_step = trainer.steps()});  // after a trainer.load, where it left off
  for (std::size_t epoch = trainer.epochs_started(); epoch < epochs; ++epoch)
    for (const auto& b : trainer.epoch(loader)) {
      const double loss = trainer.step([&](auto& r) {
        const auto ce = ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y, b.weights);
        r.backward(ce.grad);
        return ce.loss;
      });
      progress.step(loss);  // rank 0: a line redrawn in place on a terminal, a line per quarter epoch elsewhere
    }
  // [end doc]
}

void consume(const std::vector<float>&) {}

void a_stream(std::size_t steps) {
  // [doc: loaders.md]
  #include <ddp/data/batch_stream.hpp>

  ddp::data::batch_stream<std::vector<float>> stream(
      steps, [](std::size_t i) { return std::vector<float>(1024, static_cast<float>(i)); },
      ddp::data::prefetch{2});
  for (const auto& batch : stream) consume(batch);
  // [end doc]
}

// Every function above, instantiated with real arguments (never run: they need data and ranks).
void instantiate() {
  ddp::inproc::launch(1, [](ddp::inproc::communicator& comm) {
    model m = make_model(1);
    ddp::host::device dev;
    construction(m, comm, dev);
    trainer_t trainer(m, comm, dev);
    const auto test_set = fashion_mnist::load(fashion_mnist::split::test);
    const ddp::data::loader l(test_set, 64, collate);
    const auto batches = l.batches(std::vector<std::size_t>{0, 1}).to_vector();
    std::vector<fashion_mnist::batch> plain(batches.begin(), batches.end());
    a_step(trainer, plain[0].x, plain[0].y);
    accumulation(trainer, plain);
    evaluation(trainer, m, test_set);
    schedules(trainer, 100, 1, 0.1f);
    parameter_groups(trainer);
    clipping(trainer, plain[0]);
    mixed_precision(comm, dev, plain[0]);
    model other = make_model(2);
    choose_at_run_time(other, comm, dev, {});
    join(trainer, plain);
    timeline(trainer, plain);
    using_the_loader(trainer, 1);
    checkpoints(trainer, l, "/tmp/ddp-snippet-checkpoint", 1, 0.1f, ddp::optim::schedule::constant{});
    keeping_checkpoints(trainer, m, l, test_set, "/tmp/ddp-snippet-checkpoints", 1);
    progress_report(trainer, l, comm, 1);
    generator g = make_model(2);
    gan(g, make_model(3), comm, dev, ddp::optim::sgd{}, {}, {}, {});
  });
  a_stream(2);
  record_file f("/dev/null");
  const std::vector<std::int32_t> tokens(64);
  packed_windows w{&tokens, 8, 2};
  (void)f.size();
  (void)w.batches({0, 1});
}

void elastic(const fashion_mnist& train_set, std::uint64_t epochs) {
  // [doc: elastic.md]
  #include <cstdio>
  #include <ddp/data/loader.hpp>
  #include <ddp/ddp.hpp>
  #include <ddp/inproc/elastic.hpp>
  #include <ddp/nn/cross_entropy.hpp>

  ddp::inproc::elastic_control control;  // control.grow(n), from any thread: n more ranks join
  const auto report = ddp::inproc::launch_elastic(4, [&](ddp::inproc::communicator& comm) {
    model module = make_model(1);
    ddp::host::device dev;
    ddp::trainer<model> trainer(module, comm, dev, ddp::optim::sgd{.lr = 0.05f, .momentum = 0.9f});
    ddp::data::loader loader(train_set, 64, &fashion_mnist::collate);
    while (trainer.epochs_started() < epochs)  // goes on from where the trainer is: after a lost rank too
      for (const auto& b : trainer.epoch(loader))
        trainer.step([&](auto& replica) {
          replica.backward(ddp::nn::softmax_cross_entropy(replica.forward(b.x), b.y, b.weights).grad);
        });
  }, {.max_restarts = 3, .control = &control});
  for (const auto& c : report.changes)  // a lost rank (failed_rank, its error) or ranks that joined (joined)
    std::printf("after %llu steps: %s; %d -> %d ranks\n", static_cast<unsigned long long>(c.steps),
                c.cause.c_str(), c.old_world, c.new_world);
  // [end doc]
}

}  // namespace snippets
