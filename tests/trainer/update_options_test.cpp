// Options of the update step: gradient clipping by global norm (after the reduction, before the
// update) and parameter groups (optimizer options per parameter), each equal to the same done on
// one process over the global batch, under replicated and sharded updates.
#include <doctest/doctest.h>

#include <cmath>

#include "ddp/ddp.hpp"
#include "ddp/host/linalg.hpp"
#include "ddp/policy/powersgd.hpp"
#include "trainer/test_model.hpp"

namespace trainer_update_options_test {

namespace {

constexpr std::size_t per_rank_batch = 8;
constexpr int steps = 4;
constexpr float max_norm = 0.3f;  // below the largest norm here (about 0.44): steps clip
const ddp::optim::sgd sgd{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-3f, .nesterov = false};

struct run {
  std::vector<std::vector<float>> params;
  std::vector<double> norms;  // before clipping, per step
};

// One process on the global batch, clipping its own gradient as torch.nn.utils.clip_grad_norm_.
run reference(int world) {
  auto model = test::make_mlp(42);
  test::reference_sgd opt(model, sgd);
  run out;
  for (int s = 0; s < steps; ++s) {
    auto b = test::make_batch(per_rank_batch * static_cast<std::size_t>(world), 1000 + s);
    model.backward(ddp::nn::softmax_cross_entropy(model.forward(b.x), b.y).grad, ddp::ready_sink{});
    double sum = 0;
    for (auto& p : model.parameters())
      for (float g : p.grad.as<float>()) sum += static_cast<double>(g) * g;
    out.norms.push_back(std::sqrt(sum));
    const double coefficient = max_norm / (out.norms.back() + 1e-6);
    if (coefficient < 1.0)
      for (auto& p : model.parameters())
        for (float& g : p.grad.as<float>()) g *= static_cast<float>(coefficient);
    opt.step();
  }
  out.params = test::parameter_values(model);
  return out;
}

template <class Update>
std::vector<run> ranks(int world) {
  return ddp::inproc::launch(world, [](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(42);
    ddp::host::device dev;
    ddp::trainer<test::mlp, Update, ddp::bucket_cap<256>> trainer(model, comm, dev, sgd);
    trainer.clip_gradient_norm(max_norm);
    run out;
    const std::size_t r = static_cast<std::size_t>(comm.rank());
    for (int s = 0; s < steps; ++s) {
      auto b = test::make_batch(per_rank_batch * static_cast<std::size_t>(comm.size()), 1000 + s)
                   .rows(r * per_rank_batch, (r + 1) * per_rank_batch);
      trainer.step([&](auto& rep) { rep.backward(ddp::nn::softmax_cross_entropy(rep.forward(b.x), b.y).grad); });
      out.norms.push_back(trainer.gradient_norm());
    }
    out.params = test::parameter_values(model);
    trainer.clip_gradient_norm(0.0f);  // off: the next step's norm is not taken, and reads 0
    auto b = test::make_batch(per_rank_batch, 999);
    trainer.step([&](auto& rep) { rep.backward(ddp::nn::softmax_cross_entropy(rep.forward(b.x), b.y).grad); });
    CHECK(trainer.gradient_norm() == 0.0);
    return out;
  });
}

template <class Update>
void check(int world) {
  const auto ref = reference(world);
  REQUIRE(*std::max_element(ref.norms.begin(), ref.norms.end()) > max_norm);  // the clip acts
  for (const auto& r : ranks<Update>(world)) {
    CHECK(test::max_relative_error(r.params, ref.params) <= 1e-5);
    for (int s = 0; s < steps; ++s) CHECK(r.norms[s] == doctest::Approx(ref.norms[s]).epsilon(1e-5));
  }
}

}  // namespace

TEST_CASE("clip_gradient_norm: equal to clipping one process's gradient on the global batch") {
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    SUBCASE("update::replicated") { check<ddp::update::replicated>(world); }
    SUBCASE("update::sharded: the shards' norms summed over the ranks") { check<ddp::update::sharded>(world); }
  }
}

TEST_CASE("clip_gradient_norm rejects a negative or NaN norm, naming the fix") {
  ddp::inproc::launch(1, [](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(1);
    ddp::host::device dev;
    ddp::trainer<test::mlp> trainer(model, comm, dev, sgd);
    CHECK_THROWS_WITH(trainer.clip_gradient_norm(-1.0f), doctest::Contains("give a positive norm, or 0 to stop"));
    CHECK_THROWS_WITH(trainer.clip_gradient_norm(std::nanf("")), doctest::Contains("give a positive norm"));
  });
}

namespace {

// The recipe: no weight decay on biases; the first layer at a tenth of the learning rate.
const ddp::optim::sgd decaying{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.05f, .nesterov = false};
ddp::optim::sgd options_of(const std::string& name) {
  auto o = decaying;
  if (name.starts_with("0.")) o.lr *= 0.1f;
  if (name.ends_with(".bias")) o.weight_decay = 0.0f;
  return o;
}

std::vector<std::vector<float>> grouped_reference(int world) {
  auto model = test::make_mlp(42);
  std::vector<std::vector<float>> momentum;
  for (auto& p : model.parameters()) momentum.emplace_back(p.value.numel(), 0.0f);
  for (int s = 0; s < steps; ++s) {
    auto b = test::make_batch(per_rank_batch * static_cast<std::size_t>(world), 1000 + s);
    model.backward(ddp::nn::softmax_cross_entropy(model.forward(b.x), b.y).grad, ddp::ready_sink{});
    std::size_t i = 0;
    for (auto& p : model.parameters()) {
      auto v = p.value.as<float>();
      auto g = p.grad.as<float>();
      ddp::host::rule_segment(v.data(), g.data(), momentum[i++].data(), v.size(), options_of(p.name).at(1));
      std::fill(g.begin(), g.end(), 0.0f);
    }
  }
  return test::parameter_values(model);
}

template <class Update>
std::vector<std::vector<std::vector<float>>> grouped_ranks(int world) {
  return ddp::inproc::launch(world, [](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(42);
    ddp::host::device dev;
    ddp::trainer<test::mlp, Update, ddp::bucket_cap<256>> trainer(model, comm, dev, decaying);
    CHECK(trainer.set_parameter_group([](std::string_view n) { return n.starts_with("0."); }, {.lr_scale = 0.1f}) == 2);
    // A later group overrides an earlier one as a whole: the bias group gives 0.bias an lr_scale of
    // 1 again, so a third group states both of 0.bias's options.
    CHECK(trainer.set_parameter_group(ddp::optim::name_ends_with({".bias"}), {.weight_decay = 0.0f}) == 4);
    CHECK(trainer.set_parameter_group([](std::string_view n) { return n == "0.bias"; },
                                      {.lr_scale = 0.1f, .weight_decay = 0.0f}) == 1);
    const std::size_t r = static_cast<std::size_t>(comm.rank());
    for (int s = 0; s < steps; ++s) {
      auto b = test::make_batch(per_rank_batch * static_cast<std::size_t>(comm.size()), 1000 + s)
                   .rows(r * per_rank_batch, (r + 1) * per_rank_batch);
      trainer.step([&](auto& rep) { rep.backward(ddp::nn::softmax_cross_entropy(rep.forward(b.x), b.y).grad); });
    }
    return test::parameter_values(model);
  });
}

}  // namespace

TEST_CASE("parameter groups: per-group lr and weight decay equal the same options applied on one process") {
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    const auto ref = grouped_reference(world);
    SUBCASE("update::replicated") {
      for (const auto& r : grouped_ranks<ddp::update::replicated>(world)) CHECK(test::max_relative_error(r, ref) <= 1e-5);
    }
    SUBCASE("update::sharded") {
      for (const auto& r : grouped_ranks<ddp::update::sharded>(world)) CHECK(test::max_relative_error(r, ref) <= 1e-5);
    }
  }
}

TEST_CASE("a parameter group that selects nothing is an error listing the names") {
  ddp::inproc::launch(1, [](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(1);
    ddp::host::device dev;
    ddp::trainer<test::mlp> trainer(model, comm, dev, decaying);
    CHECK_THROWS_WITH(trainer.set_parameter_group(ddp::optim::name_ends_with({".gamma"}), {.weight_decay = 0.0f}),
                      doctest::Contains("matched no parameter; the names are like '0.weight', '0.bias'"));
  });
}

namespace {

// Parameters after `steps` steps on `world` ranks; from step 1 on, each step as a CUDA graph's
// capture drives it (ddp::cuda::step_graph): capture(step, record), then replayed. On
// the host device the "captured" step runs at once, so its bits can be compared.
template <class Update>
std::vector<std::vector<std::vector<float>>> capture_protocol_ranks(int world, bool captured) {
  return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(42);
    ddp::host::device dev;
    ddp::trainer<test::mlp, Update, ddp::bucket_cap<256>> trainer(model, comm, dev, sgd);
    const std::size_t r = static_cast<std::size_t>(comm.rank());
    for (int s = 0; s < steps; ++s) {
      auto b = test::make_batch(per_rank_batch * static_cast<std::size_t>(comm.size()), 1000 + s)
                   .rows(r * per_rank_batch, (r + 1) * per_rank_batch);
      auto step = [&](auto& rep) { rep.backward(ddp::nn::softmax_cross_entropy(rep.forward(b.x), b.y).grad); };
      if (!captured || s == 0) {
        trainer.step(step);
        continue;
      }
      bool recorded = false;
      const auto added = trainer.capture(step, [&](auto&& run) {
        run();
        recorded = true;
      });
      CHECK(recorded);
      CHECK(trainer.steps() == static_cast<std::uint64_t>(s));  // put back: nothing ran, as far as it knows
      CHECK(added.steps == 1);
      CHECK(added.micro_batches == 1);
      for (auto c : added.update_counts) CHECK(c == 1);
      trainer.replayed(added);
    }
    CHECK(trainer.steps() == static_cast<std::uint64_t>(steps));
    CHECK(trainer.micro_batches_run() == static_cast<std::uint64_t>(steps));
    return test::parameter_values(model);
  });
}

}  // namespace

// The trainer's side of ddp::cuda::step_graph, on host ranks (the graph itself needs a GPU): a
// captured step neither sends nor reads the control floats, and takes the bits of an ordinary
// one; the host counters come back and replayed() advances them.
TEST_CASE("a step under the capture protocol takes the bits of an ordinary step, and the counters read as after it") {
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    CHECK(capture_protocol_ranks<ddp::update::replicated>(world, true) ==
          capture_protocol_ranks<ddp::update::replicated>(world, false));
    CHECK(capture_protocol_ranks<ddp::update::sharded>(world, true) ==
          capture_protocol_ranks<ddp::update::sharded>(world, false));
  }
}

TEST_CASE("what decides per step on the host refuses to be captured, naming it") {
  ddp::inproc::launch(1, [](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(1);
    ddp::host::device dev;
    ddp::trainer<test::mlp> trainer(model, comm, dev, sgd);
    CHECK_FALSE(trainer.capture_refusal());
    trainer.clip_gradient_norm(1.0f);
    auto b = test::make_batch(4, 7);
    auto step = [&](auto& rep) { rep.backward(ddp::nn::softmax_cross_entropy(rep.forward(b.x), b.y).grad); };
    CHECK_THROWS_WITH(trainer.capture(step, [](auto&& run) { run(); }),
                      doctest::Contains("gradient clipping reads the gradient norm"));
    trainer.clip_gradient_norm(0.0f);
    trainer.accumulate(step);
    CHECK(trainer.capture_refusal().value_or("").find("accumulate()") != std::string::npos);
  });
  ddp::inproc::launch(1, [](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(1);
    ddp::host::device dev;
    ddp::trainer<test::mlp, ddp::optim::adamw> trainer(model, comm, dev, {});
    CHECK(trainer.capture_refusal().value_or("").find("AdamW's bias correction") != std::string::npos);
  });
}

namespace {

// `steps` ordinary steps on `world` ranks; with `attempt`, every rank first tries to capture its
// second step (ddp::cuda::step_graph's protocol) and is refused. The refusal is decided before
// record() runs, that is before a GPU would begin capturing: the error names why, record() never
// runs, the counters are untouched, and nothing is aborted, so the steps that follow run on every
// rank and take the bits of a trainer that never tried.
template <class... Policies>
std::vector<std::vector<std::vector<float>>> after_a_refused_capture(int world, bool attempt, const char* why,
                                                                     float clip = 0.0f) {
  return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(42);
    ddp::host::device dev;
    ddp::trainer<test::mlp, Policies..., ddp::bucket_cap<256>> trainer(model, comm, dev, sgd);
    if (clip > 0.0f) trainer.clip_gradient_norm(clip);
    const std::size_t r = static_cast<std::size_t>(comm.rank());
    for (int s = 0; s < steps; ++s) {
      auto b = test::make_batch(per_rank_batch * static_cast<std::size_t>(comm.size()), 1000 + s)
                   .rows(r * per_rank_batch, (r + 1) * per_rank_batch);
      auto step = [&](auto& rep) { rep.backward(ddp::nn::softmax_cross_entropy(rep.forward(b.x), b.y).grad); };
      if (attempt && s == 1) {
        CHECK(trainer.capture_refusal().value_or("").find(why) != std::string::npos);
        bool recorded = false;
        std::string message;
        try {
          trainer.capture(step, [&](auto&& run) {
            recorded = true;
            run();
          });
        } catch (const ddp::error& e) {
          message = e.what();
        }
        CHECK(message.find(why) != std::string::npos);
        CHECK_FALSE(recorded);
        CHECK(trainer.steps() == 1);
        CHECK(trainer.micro_batches_run() == 1);
        comm.barrier().wait();  // not aborted: a collective still joins every rank
      }
      trainer.step(step);
    }
    CHECK(trainer.steps() == static_cast<std::uint64_t>(steps));
    return test::parameter_values(model);
  });
}

}  // namespace

TEST_CASE("a refused capture is decided before it records anything: no rank is aborted, the next steps run on all") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    SUBCASE("gradient clipping") {
      const char* why = "gradient clipping reads the gradient norm on the host";
      CHECK(after_a_refused_capture<>(world, true, why, max_norm) == after_a_refused_capture<>(world, false, why, max_norm));
    }
    SUBCASE("a communication hook that keeps host state (PowerSGD)") {
      const char* why = "the communication hook 'powersgd<1>' keeps host-side state per step";
      CHECK(after_a_refused_capture<ddp::comm_hook::powersgd<1>>(world, true, why) ==
            after_a_refused_capture<ddp::comm_hook::powersgd<1>>(world, false, why));
    }
  }
}

}  // namespace trainer_update_options_test
