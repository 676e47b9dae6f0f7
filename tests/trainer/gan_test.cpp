// Two trainers over one communicator, a generator and a discriminator trained as a GAN trains
// them: the generator's step backpropagates through the discriminator, which hands back the
// gradient with respect to its input (ddp::nn::sequential::compute_input_gradient). Equal to one
// process on the global batch.
#include <doctest/doctest.h>

#include "ddp/ddp.hpp"
#include "ddp/host/device.hpp"
#include "ddp/inproc/launch.hpp"
#include "trainer/test_model.hpp"

namespace trainer_gan_test {

namespace {

using generator = ddp::nn::sequential<ddp::nn::linear, ddp::nn::relu, ddp::nn::linear>;
using discriminator = ddp::nn::sequential<ddp::nn::linear, ddp::nn::relu, ddp::nn::linear>;
constexpr std::size_t latent = 4, per_rank_batch = 4;
constexpr int iterations = 3;
const ddp::optim::sgd settings{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-3f, .nesterov = false};

generator make_generator() {
  return generator(ddp::nn::linear(latent, 16, 11), ddp::nn::relu(), ddp::nn::linear(16, test::in_features, 12));
}
discriminator make_discriminator() {
  discriminator d(ddp::nn::linear(test::in_features, 16, 21), ddp::nn::relu(), ddp::nn::linear(16, 2, 22));
  d.compute_input_gradient();  // the generator's step needs d loss / d (generated sample)
  return d;
}

ddp::nn::matrix noise(std::size_t n, std::uint64_t seed) {
  ddp::splitmix64 rng(seed);
  ddp::nn::matrix z(n, latent);
  for (auto& v : z.data) v = rng.uniform(-1.0f, 1.0f);
  return z;
}

std::vector<std::int32_t> labels(std::size_t n, bool real) { return std::vector<std::int32_t>(n, real ? 1 : 0); }

// Iteration i's data, rows [begin, end) of the global batch of `global` rows.
struct slice {
  ddp::nn::matrix real, z;
};
slice data(int i, std::size_t global, std::size_t begin, std::size_t end) {
  const auto real = test::make_batch(global, 500 + static_cast<std::uint64_t>(i)).x;
  const auto z = noise(global, 900 + static_cast<std::uint64_t>(i));
  return {ddp::nn::slice_rows(real, begin, end), ddp::nn::slice_rows(z, begin, end)};
}

// The discriminator's loss: real samples labelled 1, generated ones 0 (each a mean, summed).
// Both forwards first, then the backwards innermost first: the last backward of a step sends
// the gradients.
template <class D>
void discriminator_backward(D& d, const ddp::nn::matrix& real, const ddp::nn::matrix& fake) {
  const auto on_real = ddp::nn::softmax_cross_entropy(d.forward(real), labels(real.rows, true));
  const auto on_fake = ddp::nn::softmax_cross_entropy(d.forward(fake), labels(fake.rows, false));
  d.backward(on_fake.grad);
  d.backward(on_real.grad);
}

struct result {
  std::vector<std::vector<float>> g, d;
};

result one_process(std::size_t global) {
  auto g = make_generator();
  auto d = make_discriminator();
  test::reference_sgd opt_g(g, settings), opt_d(d, settings);
  struct plain {  // backward without a trainer: readiness goes nowhere
    discriminator& d;
    auto forward(const ddp::nn::matrix& x) { return d.forward(x); }
    auto backward(const ddp::nn::matrix& grad) { return d.backward(grad, ddp::ready_sink{}); }
  } plain_d{d};
  for (int i = 0; i < iterations; ++i) {
    const auto batch = data(i, global, 0, global);
    g.eval();
    const auto fake = g.forward(batch.z);
    g.train();
    discriminator_backward(plain_d, batch.real, fake);
    opt_d.step();
    const auto out = ddp::nn::softmax_cross_entropy(d.forward(g.forward(batch.z)), labels(global, true));
    g.backward(d.backward(out.grad, ddp::ready_sink{}), ddp::ready_sink{});
    opt_g.step();
    for (auto& p : d.parameters()) {  // the generator's pass left gradients in the discriminator
      auto grad = p.grad.as<float>();
      std::fill(grad.begin(), grad.end(), 0.0f);
    }
  }
  return {test::parameter_values(g), test::parameter_values(d)};
}

result rank(ddp::inproc::communicator& comm, bool zero_discriminator) {
  auto g = make_generator();
  auto d = make_discriminator();
  ddp::host::device dev;
  ddp::trainer<generator> train_g(g, comm, dev, settings);
  ddp::trainer<discriminator> train_d(d, comm, dev, settings);
  const std::size_t global = per_rank_batch * static_cast<std::size_t>(comm.size());
  const std::size_t begin = per_rank_batch * static_cast<std::size_t>(comm.rank());
  for (int i = 0; i < iterations; ++i) {
    const auto batch = data(i, global, begin, begin + per_rank_batch);
    g.eval();
    const auto fake = g.forward(batch.z);
    g.train();
    train_d.step([&](auto& replica) { discriminator_backward(replica, batch.real, fake); });
    train_g.step([&](auto& replica) {
      const auto out = ddp::nn::softmax_cross_entropy(d.forward(replica.forward(batch.z)), labels(per_rank_batch, true));
      replica.backward(d.backward(out.grad, ddp::ready_sink{}));
    });
    if (zero_discriminator) train_d.zero_gradients();
  }
  return {test::parameter_values(g), test::parameter_values(d)};
}

}  // namespace

TEST_CASE("a GAN-style pair: two trainers over one communicator equal one process on the global batch") {
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    const auto reference = one_process(per_rank_batch * static_cast<std::size_t>(world));
    for (const auto& r : ddp::inproc::launch(world, [](auto& comm) { return rank(comm, true); })) {
      CHECK(test::max_relative_error(r.g, reference.g) <= 1e-5);
      CHECK(test::max_relative_error(r.d, reference.d) <= 1e-5);
    }
  }
}

TEST_CASE("without zero_gradients the generator's pass leaks into the discriminator's next step") {
  const auto reference = one_process(per_rank_batch * 2);
  for (const auto& r : ddp::inproc::launch(2, [](auto& comm) { return rank(comm, false); }))
    CHECK(test::max_relative_error(r.d, reference.d) > 1e-3);
}

TEST_CASE("sequential returns the input gradient only when asked, and it is d loss / d input") {
  auto d = make_discriminator();
  const auto x = test::make_batch(3, 5).x;
  const auto y = labels(3, true);
  const auto out = ddp::nn::softmax_cross_entropy(d.forward(x), y);
  const auto dx = d.backward(out.grad, ddp::ready_sink{});
  REQUIRE(dx.rows == 3);
  REQUIRE(dx.cols == test::in_features);
  d.eval();
  for (std::size_t k : {0, 7, 17}) {  // central differences of the mean loss
    auto plus = x, minus = x;
    const float h = 1e-2f;
    plus.data[k] += h;
    minus.data[k] -= h;
    const double numeric = (ddp::nn::softmax_cross_entropy(d.forward(plus), y).loss -
                            ddp::nn::softmax_cross_entropy(d.forward(minus), y).loss) / (2 * h);
    CHECK(dx.data[k] == doctest::Approx(numeric).epsilon(1e-2));
  }
  d.train();
  d.compute_input_gradient(false);
  (void)d.forward(x);
  CHECK(d.backward(out.grad, ddp::ready_sink{}).data.empty());
}

TEST_CASE("zero_gradients inside a step, or after accumulate() without step(), is an error naming the fix") {
  ddp::inproc::launch(1, [](ddp::inproc::communicator& comm) {
    auto d = make_discriminator();
    ddp::host::device dev;
    ddp::trainer<discriminator> trainer(d, comm, dev, settings);
    const auto batch = data(0, per_rank_batch, 0, per_rank_batch);
    trainer.accumulate([&](auto& replica) { discriminator_backward(replica, batch.real, batch.real); });
    CHECK_THROWS_WITH(trainer.zero_gradients(),
                      doctest::Contains("1 accumulate() micro-batch(es) have no step(); finish them with step() before zero_gradients()"));
  });
}

TEST_CASE("a forward after the step's last backward is an error on every rank, not a race") {
  // forward, backward, forward, backward: the first backward is the step's last one as far as
  // the trainer can tell, and its buckets are on their way when the second backward would add.
  std::vector<std::string> errors;
  try {
    ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) {
      auto d = make_discriminator();
      ddp::host::device dev;
      ddp::trainer<discriminator> trainer(d, comm, dev, settings);
      const auto batch = data(0, per_rank_batch, 0, per_rank_batch);
      const auto ones = labels(per_rank_batch, true);
      trainer.step([&](auto& replica) {
        replica.backward(ddp::nn::softmax_cross_entropy(replica.forward(batch.real), ones).grad);
        replica.backward(ddp::nn::softmax_cross_entropy(replica.forward(batch.real), ones).grad);
      });
    });
  } catch (const ddp::inproc::launch_error& e) {
    errors = e.rank_errors();
  }
  REQUIRE(errors.size() == 2);
  for (const auto& e : errors) {
    CAPTURE(e);
    CHECK(e.find("a forward after this step's last backward") != std::string::npos);
  }
}

}  // namespace trainer_gan_test
