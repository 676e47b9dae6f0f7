// The trainer on the GPU engines (CUDA device, NCCL communicator) takes the same steps as on the
// host path (host device, in-process ranks) for the same reference model, data and seed, and
// checks P3 on the GPU.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/staged_communicator.hpp"
#include "ddp/core/random.hpp"
#include "ddp/nn/cuda/batch_norm.hpp"
#include "ddp/nn/cuda/cross_entropy.hpp"
#include "ddp/nn/cuda/linear.hpp"
#include "ddp/nn/cuda/relu.hpp"
#include "ddp/nn/cuda/sync.hpp"
#include "ddp/cuda/step_graph.hpp"
#include "ddp/host/device.hpp"
#include "ddp/host/half.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/nccl/communicator.hpp"
#include "ddp/nn/batch_norm.hpp"
#include "ddp/nn/cross_entropy.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/relu.hpp"
#include "ddp/nn/sequential.hpp"
#include "ddp/nn/sync.hpp"
#include "ddp/sampler/virtual_shards.hpp"
#include "ddp/trainer/trainer.hpp"

namespace {

namespace g = ddp::nn::cuda;
using host_model = ddp::nn::sequential<ddp::nn::linear, ddp::nn::batch_norm, ddp::nn::relu, ddp::nn::linear>;
using gpu_model = ddp::nn::sequential<g::linear, g::batch_norm, g::relu, g::linear>;

struct batch {
  ddp::nn::matrix x;
  std::vector<std::int32_t> y;
};

std::vector<batch> make_batches(int n) {
  ddp::splitmix64 rng(99);
  std::vector<batch> out;
  for (int b = 0; b < n; ++b) {
    batch bt{ddp::nn::matrix(16, 6), std::vector<std::int32_t>(16)};
    for (auto& v : bt.x.data) v = rng.uniform(-2.0f, 2.0f);
    for (auto& l : bt.y) l = static_cast<std::int32_t>(rng.next() % 3);
    out.push_back(std::move(bt));
  }
  return out;
}

// The parameters, as floats, after the steps (each step: `micro` micro-batches).
template <class Optimizer>
std::vector<std::vector<float>> train_on_host(const std::vector<batch>& data, int micro, Optimizer opt) {
  return ddp::inproc::launch(1, [&](ddp::inproc::communicator& comm) {
    host_model m(ddp::nn::linear(6, 8, 1), ddp::nn::batch_norm(8), ddp::nn::relu(), ddp::nn::linear(8, 3, 2));
    ddp::host::device dev;
    ddp::trainer<host_model, Optimizer> t(m, comm, dev, opt);
    for (std::size_t i = 0; i < data.size(); i += static_cast<std::size_t>(micro)) {
      for (int k = 0; k + 1 < micro; ++k)
        t.accumulate([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(data[i + k].x), data[i + k].y).grad); });
      const auto& last = data[i + static_cast<std::size_t>(micro) - 1];
      t.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(last.x), last.y).grad); });
    }
    std::vector<std::vector<float>> state;
    for (auto& p : m.parameters()) state.emplace_back(p.value.as<float>().begin(), p.value.as<float>().end());
    return state;
  })[0];
}

// The GPU model's parameters, copied to the host.
template <class Model>
std::vector<std::vector<float>> parameters_on_host(Model& m, ddp::cuda::device& dev) {
  std::vector<std::vector<float>> state;
  for (auto& p : m.parameters()) {
    std::vector<float> v(p.value.numel());
    dev.copy_to_host(v.data(), p.value.data, v.size() * sizeof(float));
    state.push_back(std::move(v));
  }
  return state;
}

template <class Optimizer, class Update = ddp::update::replicated>
std::vector<std::vector<float>> train_on_gpu(const std::vector<batch>& data, int micro, Optimizer opt) {
  return ddp::inproc::launch(1, [&](ddp::inproc::communicator& host) {
    ddp::cuda::device dev(0, host.rank());
    auto comm = ddp::nccl::bootstrap(host, dev);
    gpu_model m(g::linear(dev, 6, 8, 1), g::batch_norm(dev, 8), g::relu(), g::linear(dev, 8, 3, 2));
    ddp::trainer<gpu_model, Optimizer, Update, ddp::use_communicator<ddp::nccl::communicator>,
                 ddp::use_device<ddp::cuda::device>>
        t(m, comm, dev, opt);
    auto run = [&](const batch& b, auto& r) {
      auto x = g::matrix::from_host(dev, b.x);
      auto y = ddp::cuda::device_vector<std::int32_t>::from_host(dev, b.y);
      r.backward(g::softmax_cross_entropy(r.forward(x), y).grad);
    };
    for (std::size_t i = 0; i < data.size(); i += static_cast<std::size_t>(micro)) {
      for (int k = 0; k + 1 < micro; ++k) t.accumulate([&](auto& r) { run(data[i + k], r); });
      t.step([&](auto& r) { run(data[i + static_cast<std::size_t>(micro) - 1], r); });
    }
    return parameters_on_host(m, dev);
  })[0];
}

// Rank `rank`'s equal share of a batch (the rows left over when `world` does not divide it go unused).
batch share_of(const batch& b, int rank, int world) {
  const std::size_t per = b.x.rows / static_cast<std::size_t>(world), begin = per * static_cast<std::size_t>(rank);
  return {ddp::nn::slice_rows(b.x, begin, begin + per),
          std::vector<std::int32_t>(b.y.begin() + static_cast<std::ptrdiff_t>(begin),
                                    b.y.begin() + static_cast<std::ptrdiff_t>(begin + per))};
}

const ddp::optim::sgd shared_gpu_sgd{.lr = 0.1f, .momentum = 0.9f};

// `world` in-process ranks on the host, each on its share of every batch; with
// `sync_statistics`, batch_norm's statistics are those of the global batch.
template <class Update>
std::vector<std::vector<float>> train_ranks_on_host(const std::vector<batch>& data, int world,
                                                    bool sync_statistics = false) {
  return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
    host_model m(ddp::nn::linear(6, 8, 1), ddp::nn::batch_norm(8), ddp::nn::relu(), ddp::nn::linear(8, 3, 2));
    if (sync_statistics) m.layer<1>().synchronize_statistics(ddp::nn::sum_over_ranks(comm));
    ddp::host::device dev;
    ddp::trainer<host_model, Update> t(m, comm, dev, shared_gpu_sgd);
    for (const auto& b : data) {
      const auto mine = share_of(b, comm.rank(), world);
      t.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(mine.x), mine.y).grad); });
    }
    t.gather_parameters();
    std::vector<std::vector<float>> state;
    for (auto& p : m.parameters()) state.emplace_back(p.value.as<float>().begin(), p.value.as<float>().end());
    return state;
  })[0];
}

// The same `world` ranks all on GPU 0, their collectives staged through the host (NCCL refuses
// two ranks on one device); with `sync_statistics`, batch_norm's sums go through the host
// communicator (g::sum_over_ranks over host memory); with `overlap`, the optimizer overlapped with
// the reductions. `More`: further policies (a bucket plan).
template <class Update, class... More>
std::vector<std::vector<float>> train_ranks_on_one_gpu(const std::vector<batch>& data, int world,
                                                       bool sync_statistics = false, bool overlap = false) {
  const auto ranks = ddp::inproc::launch(world, [&](ddp::inproc::communicator& host) {
    ddp::cuda::device dev(0, host.rank());
    ddp::comm::staged_communicator<ddp::inproc::communicator, ddp::cuda::device> comm(host, dev);
    gpu_model m(g::linear(dev, 6, 8, 1), g::batch_norm(dev, 8), g::relu(), g::linear(dev, 8, 3, 2));
    if (sync_statistics) m.layer<1>().synchronize_statistics(g::sum_over_ranks(host, dev));
    ddp::trainer<gpu_model, Update, More..., ddp::use_communicator<decltype(comm)>, ddp::use_device<ddp::cuda::device>>
        t(m, comm, dev, shared_gpu_sgd);
    t.overlap_optimizer(overlap);
    for (const auto& b : data) {
      const auto mine = share_of(b, host.rank(), world);
      auto x = g::matrix::from_host(dev, mine.x);
      auto y = ddp::cuda::device_vector<std::int32_t>::from_host(dev, mine.y);
      t.step([&](auto& r) { r.backward(g::softmax_cross_entropy(r.forward(x), y).grad); });
    }
    t.gather_parameters();  // update::fully_sharded: the module holds its parameters only when gathered
    return parameters_on_host(m, dev);
  });
  for (const auto& r : ranks) CHECK(r == ranks[0]);  // every rank the same bits
  return ranks[0];
}

// The largest difference between two sets of tensors of the same shapes.
double largest_difference(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    REQUIRE(a[k].size() == b[k].size());
    for (std::size_t i = 0; i < a[k].size(); ++i) worst = std::max(worst, double(std::fabs(a[k][i] - b[k][i])));
  }
  return worst;
}

void check_same(const std::vector<std::vector<float>>& gpu, const std::vector<std::vector<float>>& host) {
  REQUIRE(gpu.size() == host.size());
  for (std::size_t k = 0; k < gpu.size(); ++k) {
    INFO("parameter ", k);
    CHECK(largest_difference({gpu[k]}, {host[k]}) < 1e-4);
  }
}

}  // namespace

// NCCL's collectives run on a stream: their work handles have no host-side timing, so the
// trainer reports its overlap as unmeasured instead of zero.
static_assert(!ddp::timed_work_handle<ddp::nccl::work>);
// Its wait() only orders the compute stream: a failure found later comes through rethrow_failure().
static_assert(ddp::stream_ordered_work<ddp::nccl::work>);

TEST_CASE("GPU trainer (cuda device, nccl) equals the host trainer: SGD with momentum") {
  const auto data = make_batches(4);
  const ddp::optim::sgd opt{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-3f};
  check_same(train_on_gpu(data, 1, opt), train_on_host(data, 1, opt));
}

// AdamW with a meaningful comparison. The first linear's bias feeds batch_norm, which removes
// any per-feature shift: its true gradient is zero, and what backward computes is rounding noise
// (about 4e-9 on the host), different on the GPU (fused multiply-adds, cuBLAS's summation order).
// With eps = 1e-8 AdamW divides that noise by its own root mean square and steps about 0.3 lr
// either way: moving the inputs by one ulp on the host alone moves a parameter by 6.9e-3 after
// these two steps. With eps = 1e-3, far above the noise, the same nudge moves none by more than
// 9e-8 (measured on the host, 2026-12-01), so the 1e-4 bound compares the devices, not the noise.
const ddp::optim::adamw noise_proof_adamw{.lr = 1e-2f, .eps = 1e-3f};

TEST_CASE("GPU trainer equals the host trainer: AdamW with two micro-batches per step") {
  const auto data = make_batches(4);
  const auto opt = noise_proof_adamw;
  check_same(train_on_gpu(data, 2, opt), train_on_host(data, 2, opt));
}

TEST_CASE("GPU trainer with update::sharded (in-place reduce_scatter and all_gather, bound parameters) equals the host "
          "trainer: AdamW with two micro-batches per step") {
  const auto data = make_batches(4);
  const auto opt = noise_proof_adamw;
  check_same(train_on_gpu<ddp::optim::adamw, ddp::update::sharded>(data, 2, opt), train_on_host(data, 2, opt));
}

TEST_CASE("GPU trainer with update::sharded_gradients (the gradients placed layer by layer, device memory held only "
          "while they reduce) equals the host trainer: AdamW with two micro-batches per step") {
  const auto data = make_batches(4);
  const auto opt = noise_proof_adamw;
  check_same(train_on_gpu<ddp::optim::adamw, ddp::update::sharded_gradients>(data, 2, opt), train_on_host(data, 2, opt));
}

namespace {

// batch_norm's running mean, then its running variance.
std::vector<std::vector<float>> running_statistics(const ddp::nn::batch_norm& bn) {
  return {{bn.running_mean().begin(), bn.running_mean().end()}, {bn.running_var().begin(), bn.running_var().end()}};
}
std::vector<std::vector<float>> running_statistics(const g::batch_norm& bn) { return {bn.running_mean(), bn.running_var()}; }

}  // namespace

// At one rank NCCL has nothing to add: its in-place sum leaves the sums as they are. What this
// checks is the route: the layer's sums go through NCCL's all-reduce (f64, in place in GPU
// memory) twice a step, the forward's moments and the backward's sums, and the kernels after it
// read them: the running statistics and the parameters equal those the host computes over each
// batch. That the sum over several ranks is right is the next case's (through the host), since
// NCCL takes one rank per GPU.
TEST_CASE("GPU batch_norm's statistics through NCCL at one rank: every step's sums go through it, and come back as the "
          "host computes them") {
  const auto data = make_batches(3);
  const ddp::optim::sgd opt{.lr = 0.05f, .momentum = 0.9f};
  std::vector<std::vector<float>> host_statistics, gpu_statistics;
  const auto host = ddp::inproc::launch(1, [&](ddp::inproc::communicator& comm) {
    host_model m(ddp::nn::linear(6, 8, 1), ddp::nn::batch_norm(8), ddp::nn::relu(), ddp::nn::linear(8, 3, 2));
    ddp::host::device dev;
    ddp::trainer<host_model> t(m, comm, dev, opt);
    for (const auto& b : data)
      t.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    host_statistics = running_statistics(m.layer<1>());
    std::vector<std::vector<float>> state;
    for (auto& p : m.parameters()) state.emplace_back(p.value.as<float>().begin(), p.value.as<float>().end());
    return state;
  })[0];
  std::size_t reductions = 0;
  const auto gpu = ddp::inproc::launch(1, [&](ddp::inproc::communicator& host_comm) {
    ddp::cuda::device dev(0, host_comm.rank());
    auto comm = ddp::nccl::bootstrap(host_comm, dev);
    gpu_model m(g::linear(dev, 6, 8, 1), g::batch_norm(dev, 8), g::relu(), g::linear(dev, 8, 3, 2));
    m.layer<1>().synchronize_statistics([&, nccl = g::sum_over_ranks(comm, dev)](std::span<double> sums) {
      ++reductions;
      nccl(sums);
    });
    ddp::trainer<gpu_model, ddp::use_communicator<ddp::nccl::communicator>, ddp::use_device<ddp::cuda::device>> t(
        m, comm, dev, opt);
    for (const auto& b : data) {
      auto x = g::matrix::from_host(dev, b.x);
      auto y = ddp::cuda::device_vector<std::int32_t>::from_host(dev, b.y);
      t.step([&](auto& r) { r.backward(g::softmax_cross_entropy(r.forward(x), y).grad); });
    }
    gpu_statistics = running_statistics(m.layer<1>());
    return parameters_on_host(m, dev);
  })[0];
  CHECK(reductions == 2 * data.size());
  CHECK(largest_difference(gpu_statistics, host_statistics) < 1e-4);
  check_same(gpu, host);
}

// The sums really summed: 2 and 3 ranks on one GPU, each on its share of every batch, their
// statistics synchronised through the host communicator, take the steps of as many host ranks
// with synchronised statistics (the statistics of the global batch). Unsynchronised host ranks
// end more than 1e-3 away (4e-2 at 2 ranks, 6e-2 at 3, measured), so a GPU reduction that summed
// nothing would fail.
TEST_CASE("GPU batch_norm's statistics summed over 2 and 3 ranks on one GPU equal the host ranks' synchronised ones") {
  const auto data = make_batches(4);
  for (int world : {2, 3}) {
    CAPTURE(world);
    const auto host = train_ranks_on_host<ddp::update::replicated>(data, world, true);
    REQUIRE(largest_difference(train_ranks_on_host<ddp::update::replicated>(data, world, false), host) > 1e-3);
    check_same(train_ranks_on_one_gpu<ddp::update::replicated>(data, world, true), host);
  }
}

namespace {
// Claims its parameter is on cuda:0 while the memory is host memory: the trainer must find out.
struct misplaced_module {
  using input_type = int;
  using output_type = int;
  static constexpr bool reports_gradient_ready = true;  // never stepped: P3 fails at construction
  std::vector<float> w = std::vector<float>(4, 1.0f), gw = std::vector<float>(4, 0.0f);
  std::vector<ddp::parameter_ref> parameters() {
    return {{"layer.weight", ddp::make_tensor_ref(std::span<float>(w), {4}, ddp::device_id::cuda(0)),
             ddp::make_tensor_ref(std::span<float>(gw), {4}, ddp::device_id::cuda(0))}};
  }
  std::vector<ddp::buffer_ref> buffers() { return {}; }
  int forward(int x) { return x; }
  void backward(int, const ddp::ready_sink&) {}
};
}  // namespace

TEST_CASE("a parameter in host memory is caught before the first collective, named with both devices (P3)") {
  std::string message;
  try {
    ddp::inproc::launch(1, [&](ddp::inproc::communicator& host) {
      ddp::cuda::device dev(0, host.rank());
      auto comm = ddp::nccl::bootstrap(host, dev);
      misplaced_module m;
      ddp::trainer<misplaced_module, ddp::use_communicator<ddp::nccl::communicator>, ddp::use_device<ddp::cuda::device>>
          t(m, comm, dev);
    });
  } catch (const ddp::error& e) {
    message = e.what();
  }
  CHECK(message.find("parameter 'layer.weight' lives on cpu but this rank's device is cuda:0") != std::string::npos);
}

TEST_CASE("cuda batch_norm counts one batch per training forward (num_batches_tracked), as the host's") {
  ddp::cuda::device dev(0);
  g::batch_norm bn(dev, 8);
  ddp::nn::batch_norm host_bn(8);
  const auto data = make_batches(3);
  for (int k = 0; k < 3; ++k) {
    ddp::nn::matrix x(16, 8);
    for (std::size_t i = 0; i < x.data.size(); ++i) x.data[i] = data[static_cast<std::size_t>(k)].x.data[i % 96];
    (void)bn.forward(g::matrix::from_host(dev, x), /*training=*/true);
    (void)host_bn.forward(x, /*training=*/true);
    CHECK(bn.batches_tracked() == k + 1);  // one kernel thread adds, not one per thread of its block
    CHECK(host_bn.batches_tracked() == k + 1);
  }
}

TEST_CASE_TEMPLATE("2 and 3 ranks on one GPU (staged_communicator) equal 2 and 3 host ranks", Update,
                   ddp::update::replicated, ddp::update::sharded, ddp::update::sharded_gradients,
                   ddp::update::fully_sharded) {
  // The buckets, the shard that does not start at 0 (sharded), the control floats: the trainer's
  // multi-rank logic on the CUDA device, which NCCL's one-rank-per-GPU rule keeps from one GPU.
  const auto data = make_batches(4);
  for (int world : {2, 3}) {
    CAPTURE(world);
    check_same(train_ranks_on_one_gpu<Update>(data, world), train_ranks_on_host<Update>(data, world));
  }
}

TEST_CASE_TEMPLATE("the optimizer overlapped with the reductions on one GPU (staged ranks, a bucket per tensor) gives "
                   "the bits of the plain update", Update, ddp::update::replicated, ddp::update::sharded_gradients) {
  const auto data = make_batches(4);
  using per_tensor = ddp::bucket_cap<64>;  // 16 floats: every weight and vector a bucket of its own
  for (int world : {2, 3}) {
    CAPTURE(world);
    CHECK(train_ranks_on_one_gpu<Update, per_tensor>(data, world, false, /*overlap=*/true) ==
          train_ranks_on_one_gpu<Update, per_tensor>(data, world));
  }
}

TEST_CASE_TEMPLATE("reduction::invariant<4> on the GPU: 1, 2, 3 and 4 ranks on one GPU (staged) give the same bits, "
                   "and the host's to rounding", Update, ddp::update::replicated, ddp::update::sharded,
                   ddp::update::sharded_gradients) {
  // Each rank runs its virtual shards of every 16-sample batch as micro-batches of 4; the exact
  // sum stages the buckets through host memory (block maxima, integers, average).
  using gpu_mlp = ddp::nn::sequential<g::linear, g::relu, g::linear>;
  using host_mlp = ddp::nn::sequential<ddp::nn::linear, ddp::nn::relu, ddp::nn::linear>;
  using invariant = ddp::reduction::invariant<4>;
  const auto data = make_batches(3);
  auto on_gpu = [&](int world) {
    const auto ranks = ddp::inproc::launch(world, [&](ddp::inproc::communicator& host) {
      ddp::cuda::device dev(0, host.rank());
      ddp::comm::staged_communicator<ddp::inproc::communicator, ddp::cuda::device> comm(host, dev);
      gpu_mlp m(g::linear(dev, 6, 8, 1), g::relu(), g::linear(dev, 8, 3, 2));
      ddp::trainer<gpu_mlp, invariant, Update, ddp::use_communicator<decltype(comm)>, ddp::use_device<ddp::cuda::device>>
          t(m, comm, dev, shared_gpu_sgd);
      const auto mine = ddp::sampler::virtual_shards(4, host.rank(), world);
      for (const auto& b : data)
        for (std::size_t s = mine.first; s < mine.last; ++s) {
          const std::size_t begin = mine.begin(s, b.y.size()), end = mine.end(s, b.y.size());
          auto x = g::matrix::from_host(dev, ddp::nn::slice_rows(b.x, begin, end));
          auto y = ddp::cuda::device_vector<std::int32_t>::from_host(
              dev, std::span<const std::int32_t>(b.y.data() + begin, end - begin));
          auto f = [&](auto& r) { r.backward(g::softmax_cross_entropy(r.forward(x), y).grad); };
          if (s + 1 < mine.last) t.accumulate(f);
          else t.step(f);
        }
      return parameters_on_host(m, dev);
    });
    for (const auto& r : ranks) CHECK(r == ranks[0]);
    return ranks[0];
  };
  const auto one = on_gpu(1);
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    CHECK(on_gpu(world) == one);
  }
  const auto host = ddp::inproc::launch(1, [&](ddp::inproc::communicator& comm) {
    host_mlp m(ddp::nn::linear(6, 8, 1), ddp::nn::relu(), ddp::nn::linear(8, 3, 2));
    ddp::host::device dev;
    ddp::trainer<host_mlp, invariant, Update> t(m, comm, dev, shared_gpu_sgd);
    for (const auto& b : data)
      for (std::size_t s = 0; s < 4; ++s) {
        const auto x = ddp::nn::slice_rows(b.x, s * 4, s * 4 + 4);
        const std::span<const std::int32_t> y(b.y.data() + s * 4, 4);
        auto f = [&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(x), y).grad); };
        if (s + 1 < 4) t.accumulate(f);
        else t.step(f);
      }
    std::vector<std::vector<float>> state;
    for (auto& p : m.parameters()) state.emplace_back(p.value.as<float>().begin(), p.value.as<float>().end());
    return state;
  })[0];
  check_same(one, host);
}

TEST_CASE("bf16 parameters on the GPU (nn::cuda, f32 master in the trainer) track bf16 parameters on the host") {
  // One rank each way, the same model cast to bf16, SGD with momentum. The GPU's f32 arithmetic
  // (cuBLAS, fused multiply-adds) differs from the host's in the last bits; a master that moves by
  // that much may round to the neighbouring bf16 value. Bound: two bf16 steps of each value (2^-7
  // of it), plus 1e-4 for values near zero.
  const auto data = make_batches(6);
  auto widen = [](std::vector<std::uint16_t> h) {
    std::vector<float> v(h.size());
    ddp::host::widen<ddp::host::bf16_format>(h.data(), v.data(), h.size());
    return v;
  };
  const auto host = ddp::inproc::launch(1, [&](ddp::inproc::communicator& comm) {
    host_model m(ddp::nn::linear(6, 8, 1), ddp::nn::batch_norm(8), ddp::nn::relu(), ddp::nn::linear(8, 3, 2));
    m.cast_parameters(ddp::dtype::bf16);
    ddp::host::device dev;
    ddp::trainer<host_model> t(m, comm, dev, shared_gpu_sgd);
    for (const auto& b : data)
      t.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    std::vector<std::vector<float>> state;
    for (auto& p : m.parameters()) {
      const auto* h = static_cast<const std::uint16_t*>(p.value.data);
      state.push_back(widen(std::vector<std::uint16_t>(h, h + p.value.numel())));
    }
    return state;
  })[0];
  const auto gpu = ddp::inproc::launch(1, [&](ddp::inproc::communicator& host_comm) {
    ddp::cuda::device dev(0, host_comm.rank());
    auto comm = ddp::nccl::bootstrap(host_comm, dev);
    gpu_model m(g::linear(dev, 6, 8, 1), g::batch_norm(dev, 8), g::relu(), g::linear(dev, 8, 3, 2));
    m.cast_parameters(ddp::dtype::bf16);
    ddp::trainer<gpu_model, ddp::use_communicator<ddp::nccl::communicator>, ddp::use_device<ddp::cuda::device>> t(
        m, comm, dev, shared_gpu_sgd);
    for (const auto& b : data) {
      auto x = g::matrix::from_host(dev, b.x);
      auto y = ddp::cuda::device_vector<std::int32_t>::from_host(dev, b.y);
      t.step([&](auto& r) { r.backward(g::softmax_cross_entropy(r.forward(x), y).grad); });
    }
    std::vector<std::vector<float>> state;
    for (auto& p : m.parameters()) {
      CHECK(p.value.type == ddp::dtype::bf16);
      std::vector<std::uint16_t> h(p.value.numel());
      dev.copy_to_host(h.data(), p.value.data, h.size() * sizeof(std::uint16_t));
      state.push_back(widen(std::move(h)));
    }
    return state;
  })[0];
  REQUIRE(gpu.size() == host.size());
  for (std::size_t k = 0; k < gpu.size(); ++k) {
    INFO("parameter ", k);
    for (std::size_t i = 0; i < gpu[k].size(); ++i)
      CHECK(std::fabs(gpu[k][i] - host[k][i]) <= 0x1p-7 * std::fabs(host[k][i]) + 1e-4);
  }
}

namespace {

using graph_trainer = ddp::trainer<gpu_model, ddp::use_communicator<ddp::nccl::communicator>,
                                   ddp::use_device<ddp::cuda::device>>;

// The inputs of a captured step live at fixed device addresses; each batch is copied into them.
struct step_inputs {
  explicit step_inputs(ddp::cuda::device& dev) : x(dev, 16, 6), y(dev, 16) {}
  void load(ddp::cuda::device& dev, const batch& b) {
    dev.copy_from_host(x.data(), b.x.data.data(), b.x.data.size() * sizeof(float));
    dev.copy_from_host(y.data(), b.y.data(), b.y.size() * sizeof(std::int32_t));
  }
  g::matrix x;
  ddp::cuda::device_vector<std::int32_t> y;
};

gpu_model make_gpu_model(ddp::cuda::device& dev) {
  return gpu_model(g::linear(dev, 6, 8, 1), g::batch_norm(dev, 8), g::relu(), g::linear(dev, 8, 3, 2));
}

// Every step of `data` on one NCCL rank, captured (warm-up on the first batch, replays after) or
// not; the learning rate halves before step `lr_change` when it is in range. With `keep_logits`
// the captured step keeps its logits past its end (a result the step function stores): an
// allocation of the graph that the graph does not free, which the next launch frees
// (cudaGraphInstantiateFlagAutoFreeOnLaunch; without it the second replay would fail).
std::vector<std::vector<float>> train_one_rank(const std::vector<batch>& data, bool captured, std::size_t lr_change,
                                               std::size_t* captures = nullptr, bool keep_logits = false) {
  return ddp::inproc::launch(1, [&](ddp::inproc::communicator& host) {
    ddp::cuda::device dev(0, host.rank());
    auto comm = ddp::nccl::bootstrap(host, dev);
    auto m = make_gpu_model(dev);
    graph_trainer t(m, comm, dev, shared_gpu_sgd);
    step_inputs in(dev);
    std::optional<g::matrix> kept;
    auto step = [&](auto& r) {
      auto logits = r.forward(in.x);
      r.backward(g::softmax_cross_entropy_gradient(logits, in.y));
      // Only inside the capture: kept is empty before it, so the capture frees nothing it did not allocate.
      if (keep_logits && dev.capturing()) kept.emplace(std::move(logits));
    };
    std::optional<ddp::cuda::step_graph<graph_trainer>> graph;
    for (std::size_t i = 0; i < data.size(); ++i) {
      if (i == lr_change) t.optimizer().lr *= 0.5f;
      in.load(dev, data[i]);
      if (!captured) t.step(step);
      else if (!graph) graph.emplace(t, step);
      else graph->replay();
    }
    CHECK(t.steps() == data.size());
    if (graph) {
      if (captures) *captures = graph->captures();
      if (keep_logits) {
        CHECK(kept.has_value());
        CHECK(graph->nodes().allocations > graph->nodes().frees);  // the kept logits: allocated, never freed in it
      }
      dev.synchronize();
      graph->last_replay()->rethrow_failure();
    }
    kept.reset();  // an allocation of the graph's last launch, freed outside it while the graph lives
    return parameters_on_host(m, dev);
  })[0];
}

// Holds a stream until opened, or for `limit` at most: a host function queued on the stream.
// Work queued behind it cannot run while it holds, so a host thread that waits for that work
// waits for the gate, and returns only after it gave up. The host function owns a reference to
// the gate, so the gate outlives it whatever the test does meanwhile.
struct stream_gate {
  std::atomic<bool> open{false};
  std::atomic<bool> gave_up{false};
  std::chrono::milliseconds limit{5000};

  static std::shared_ptr<stream_gate> hold(cudaStream_t s) {
    auto gate = std::make_shared<stream_gate>();
    auto* owner = new std::shared_ptr<stream_gate>(gate);
    if (const cudaError_t status = cudaLaunchHostFunc(s, &stream_gate::wait, owner); status != cudaSuccess) {
      delete owner;
      ddp::cuda::check(status, "cudaLaunchHostFunc");
    }
    return gate;
  }
  static void CUDART_CB wait(void* p) {
    const std::unique_ptr<std::shared_ptr<stream_gate>> owner(static_cast<std::shared_ptr<stream_gate>*>(p));
    stream_gate& gate = **owner;
    const auto until = std::chrono::steady_clock::now() + gate.limit;
    while (!gate.open.load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (!gate.open.load()) gate.gave_up = true;
  }
};

}  // namespace

TEST_CASE("a step captured into a CUDA graph and replayed gives the bits of the uncaptured steps") {
  const auto data = make_batches(6);
  const auto eager = train_one_rank(data, false, data.size());
  std::size_t captures = 0;
  CHECK(train_one_rank(data, true, data.size(), &captures) == eager);
  CHECK(captures == 1);
  // A schedule's change of the learning rate is captured again, and the bits still agree.
  const auto eager_scheduled = train_one_rank(data, false, 3);
  CHECK(train_one_rank(data, true, 3, &captures) == eager_scheduled);
  CHECK(captures == 2);
  // A step that keeps a result past its end replays as often as the others.
  CHECK(train_one_rank(data, true, data.size(), &captures, /*keep_logits=*/true) == eager);
  CHECK(captures == 1);
}

TEST_CASE("replays wait for nothing on the host, and the graph holds every launch of the step") {
  const auto data = make_batches(4);
  ddp::inproc::launch(1, [&](ddp::inproc::communicator& host) {
    ddp::cuda::device dev(0, host.rank());
    auto comm = ddp::nccl::bootstrap(host, dev);
    auto m = make_gpu_model(dev);
    graph_trainer t(m, comm, dev, shared_gpu_sgd);
    step_inputs in(dev);
    in.load(dev, data[0]);
    const auto eager_waits = dev.host_waits();
    t.step([&](auto& r) { r.backward(g::softmax_cross_entropy_gradient(r.forward(in.x), in.y)); });
    const auto waits_per_eager_step = dev.host_waits() - eager_waits;
    ddp::cuda::step_graph graph(t, [&](auto& r) { r.backward(g::softmax_cross_entropy_gradient(r.forward(in.x), in.y)); });

    // The stream is held while the replays are queued: had a replay waited for the GPU in any way
    // (a stream, event or device synchronisation, a blocking copy, the device's own waits), it
    // would have returned only after the gate gave up.
    const auto gate = stream_gate::hold(dev.stream());
    const auto before = dev.host_waits();
    for (std::size_t i = 1; i < data.size(); ++i) graph.replay();  // the same batch: only the waits matter
    const bool returned_while_held = !gate->gave_up.load();
    gate->open = true;
    CHECK(returned_while_held);
    CHECK(dev.host_waits() == before);
    dev.synchronize();
    graph.last_replay()->rethrow_failure();

    // What one step of make_gpu_model() launches, read off the layers (ddp/nn/cuda/*.hpp) and the
    // update; the graph must hold at least that (cuBLAS may split a GEMM into more kernels, and
    // NCCL's all-reduce on one rank may run none, so neither is counted beyond one per GEMM).
    //   forward   linear: fill_rows + GEMM; batch_norm: column_moments, batch_statistics, add_i64,
    //             normalize; relu: 1; linear: fill_rows + GEMM; the loss gradient: 1
    //   backward  linear: GEMM (dW), add_column_sums, GEMM (dx); relu: 1; batch_norm:
    //             normalize_backward_sums, normalize_backward_input; linear: GEMM (dW),
    //             add_column_sums (no dx for the first layer)
    //   update    one optimizer kernel per bucket; one memset per bucket zeroes its gradients
    //   copies    each linear and relu keeps a copy of its input or output for backward;
    //             sequential copies the input of forward and the gradient of backward
    //   memory    every layer's output and every backward's dx: forward 5 (two linears, batch_norm,
    //             relu, the loss gradient), backward 3 (the second linear, relu, batch_norm), each
    //             allocated and freed inside the step
    constexpr std::size_t layer_kernels = (1 + 4 + 1 + 1 + 1) + (1 + 1 + 2 + 1);
    constexpr std::size_t gemms = 2 + 3;
    constexpr std::size_t saved_copies = 3, sequential_copies = 2;
    constexpr std::size_t temporaries = 5 + 3;
    const std::size_t buckets = t.bucket_count();
    const auto& n = graph.nodes();
    CHECK(n.kernels >= layer_kernels + gemms + buckets);
    CHECK(n.memsets >= buckets);
    CHECK(n.copies >= saved_copies + sequential_copies);
    CHECK(n.allocations >= temporaries);
    CHECK(n.frees >= temporaries);
    MESSAGE("one step: " << n.kernels << " kernels (at least " << layer_kernels + gemms + buckets << "), " << n.copies
                         << " copies, " << n.memsets << " memsets, " << n.allocations << " allocations, " << n.frees
                         << " frees, " << n.other << " other nodes; " << buckets
                         << " bucket(s); host waits per step: " << waits_per_eager_step << " uncaptured, 0 replayed");
  });
}

// The pool keeps what a step freed, so the next step's temporaries cost no mapping (the release
// threshold the device sets); trim_memory() gives it back, and so does a device's destructor, so
// a one-off peak (the NCCL timeout test's 32 GiB) is not kept for the rest of the process.
TEST_CASE("the memory pool keeps freed temporaries for the next step, and trim_memory and the destructor give them back") {
  const std::size_t bytes = std::size_t{1} << 30;
  ddp::cuda::device dev(0);
  dev.trim_memory();
  const auto base = dev.pool_reserved_bytes();  // what is in use now, nothing kept
  { ddp::cuda::device_vector<char> big(dev, bytes); }
  dev.synchronize();
  CHECK(dev.pool_reserved_bytes() >= base + bytes);  // kept through the synchronisation
  dev.trim_memory();
  CHECK(dev.pool_reserved_bytes() < base + bytes);
  {
    ddp::cuda::device other(0);  // the same GPU, so the same default pool
    { ddp::cuda::device_vector<char> big(other, bytes); }
    other.synchronize();
    CHECK(dev.pool_reserved_bytes() >= base + bytes);
  }
  CHECK(dev.pool_reserved_bytes() < base + bytes);  // the destroyed device gave it back
}

TEST_CASE("a step that cannot be captured is refused, naming why") {
  const auto data = make_batches(1);
  auto refusal = [&](auto configure, auto step_fn) {
    std::string seen;
    try {
      ddp::inproc::launch(1, [&](ddp::inproc::communicator& host) {
        ddp::cuda::device dev(0, host.rank());
        auto comm = ddp::nccl::bootstrap(host, dev);
        auto m = make_gpu_model(dev);
        graph_trainer t(m, comm, dev, shared_gpu_sgd);
        configure(t);
        step_inputs in(dev);
        in.load(dev, data[0]);
        try {
          ddp::cuda::step_graph graph(t, [&](auto& r) { step_fn(r, in); });
        } catch (const ddp::error& e) {
          seen = e.what();
        }
      });
    } catch (const ddp::inproc::launch_error&) {  // a refusal inside the capture aborted the rank's peers
    }
    return seen;
  };
  auto device_only = [](auto& r, step_inputs& in) {
    r.backward(g::softmax_cross_entropy_gradient(r.forward(in.x), in.y));
  };
  CHECK(refusal([](graph_trainer& t) { t.clip_gradient_norm(1.0f); }, device_only).find("gradient clipping") !=
        std::string::npos);
  // The loss read back on the host (the usual softmax_cross_entropy) cannot be captured.
  CHECK(refusal([](graph_trainer&) {},
                [](auto& r, step_inputs& in) { r.backward(g::softmax_cross_entropy(r.forward(in.x), in.y).grad); })
            .find("while the step is being captured") != std::string::npos);
}

TEST_CASE("AdamW's bias correction changes its rule every step: a captured step is refused") {
  ddp::inproc::launch(1, [&](ddp::inproc::communicator& host) {
    ddp::cuda::device dev(0, host.rank());
    auto comm = ddp::nccl::bootstrap(host, dev);
    auto m = make_gpu_model(dev);
    ddp::trainer<gpu_model, ddp::optim::adamw, ddp::use_communicator<ddp::nccl::communicator>,
                 ddp::use_device<ddp::cuda::device>>
        t(m, comm, dev, noise_proof_adamw);
    step_inputs in(dev);
    using trainer_type = decltype(t);
    try {
      ddp::cuda::step_graph<trainer_type> graph(t, [&](auto& r) {
        r.backward(g::softmax_cross_entropy_gradient(r.forward(in.x), in.y));
      });
      FAIL("captured");
    } catch (const ddp::error& e) {
      CHECK(std::string(e.what()).find("bias correction") != std::string::npos);
    }
    CHECK(t.steps() == 0);  // refused before the warm-up step
  });
}
