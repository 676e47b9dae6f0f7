// Pitfalls P1-P6 of docs/pitfalls.md: the pattern that fails in PyTorch DDP, and what ddp does
// (P4, the sampler's epoch, in tests/sampler/sampler_test.cpp).
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "ddp/ddp.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/nn/batch_norm.hpp"
#include "support/on_ranks.hpp"
#include "trainer/test_model.hpp"

namespace trainer_pitfalls_test {

using namespace std::chrono_literals;

namespace {

const ddp::optim::sgd sgd{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-2f};

using test::contains;
using test::on_ranks;

using frozen_bn_mlp = ddp::nn::sequential<ddp::nn::linear, ddp::nn::batch_norm, ddp::nn::relu, ddp::nn::linear>;
frozen_bn_mlp make_frozen_bn_mlp(std::uint64_t seed) {
  frozen_bn_mlp m(ddp::nn::linear(test::in_features, 10, seed), ddp::nn::batch_norm(10), ddp::nn::relu(),
                  ddp::nn::linear(10, test::classes, seed + 1));
  m.layer<1>().set_mode(ddp::nn::batch_norm::mode::frozen);
  return m;
}

// Contrastive-style step: two forwards, one loss over both, backwards innermost first.
template <class Replica>
void two_forward_step(Replica& r, const test::batch& a, const test::batch& b) {
  auto ca = ddp::nn::softmax_cross_entropy(r.forward(a.x), a.y);
  auto cb = ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y);
  for (auto& g : ca.grad.data) g *= 0.5f;
  for (auto& g : cb.grad.data) g *= 0.5f;
  r.backward(cb.grad);
  r.backward(ca.grad);
}

}  // namespace

TEST_CASE("P1: two forwards with broadcast_each_forward is caught by buffer version, by name, on every rank") {
  auto o = on_ranks(2, [](auto& comm) {
    auto model = make_frozen_bn_mlp(3);
    ddp::host::device dev;
    ddp::trainer<frozen_bn_mlp, ddp::buffer_sync::broadcast_each_forward> trainer(model, comm, dev, sgd);
    auto a = test::make_batch(8, 10), b = test::make_batch(8, 11);
    trainer.step([&](auto& r) { two_forward_step(r, a, b); });
  });
  REQUIRE(o.all_threw());
  for (const auto& e : o.errors) {
    CAPTURE(e);
    CHECK(contains(e, "buffer '1.running_var' was saved for backward at version"));
    CHECK(contains(e, "buffer_sync::broadcast_each_forward overwrote it"));
    CHECK(contains(e, "Use ddp::buffer_sync::broadcast_once_per_step"));
    CHECK(contains(e, "pitfall P1"));
  }
}

TEST_CASE("P1: the same model with broadcast_once_per_step trains, equal to one process") {
  const int world = 2;
  auto ref_model = make_frozen_bn_mlp(3);
  test::reference_sgd ref_opt(ref_model, sgd);
  for (int s = 0; s < 3; ++s) {
    auto g = test::make_batch(16, 100 + s);
    // Each rank's batch is split in two forwards; the global loss is the mean over all samples.
    for (int r = 0; r < world; ++r) {
      auto mine = g.rows(8 * r, 8 * r + 8);
      auto a = mine.rows(0, 4), b = mine.rows(4, 8);
      auto ca = ddp::nn::softmax_cross_entropy(ref_model.forward(a.x), a.y);
      auto cb = ddp::nn::softmax_cross_entropy(ref_model.forward(b.x), b.y);
      for (auto& v : ca.grad.data) v *= 0.25f;
      for (auto& v : cb.grad.data) v *= 0.25f;
      ref_model.backward(cb.grad, {});
      ref_model.backward(ca.grad, {});
    }
    ref_opt.step();
  }
  const auto expected = test::parameter_values(ref_model);
  auto got = ddp::inproc::launch(world, [](auto& comm) {
    auto model = make_frozen_bn_mlp(3);
    ddp::host::device dev;
    ddp::trainer<frozen_bn_mlp, ddp::buffer_sync::broadcast_once_per_step> trainer(model, comm, dev, sgd);
    for (int s = 0; s < 3; ++s) {
      auto g = test::make_batch(16, 100 + s);
      auto mine = g.rows(8 * static_cast<std::size_t>(comm.rank()), 8 * static_cast<std::size_t>(comm.rank()) + 8);
      trainer.step([&](auto& r) { two_forward_step(r, mine.rows(0, 4), mine.rows(4, 8)); });
    }
    return test::parameter_values(model);
  });
  for (const auto& rank : got) CHECK(test::max_relative_error(rank, expected) <= 1e-5);
}

TEST_CASE("P2 forbid: a parameter skipped on one rank is one error on every rank, naming it and the fixes") {
  auto o = on_ranks(3, [](auto& comm) {
    test::branchy model(5);
    ddp::host::device dev;
    ddp::trainer<test::branchy> trainer(model, comm, dev, sgd);
    auto b = test::make_batch(6, 20 + static_cast<std::uint64_t>(comm.rank()));
    model.use_aux = comm.rank() != 1;
    trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
  });
  REQUIRE(o.all_threw());
  CHECK(o.seconds < 20.0);
  for (const auto& e : o.errors) {
    CAPTURE(e);
    CHECK(contains(e, "'aux.weight' (no gradient on rank(s) 1)"));
    CHECK(contains(e, "'aux.bias' (no gradient on rank(s) 1)"));
    CHECK_FALSE(contains(e, "trunk."));
    CHECK(contains(e, "ddp::unused_params::detect_each_step"));
    CHECK(contains(e, "ddp::unused_params::static_graph"));
    CHECK(contains(e, "pitfall P2"));
  }
}

namespace {
// test::mlp behind a module that never reports ready gradients.
struct silent_mlp : test::unbound_mlp {
  using test::unbound_mlp::unbound_mlp;
  static constexpr bool reports_gradient_ready = false;
  void backward(const ddp::nn::matrix& g, const ddp::ready_sink&) { test::unbound_mlp::backward(g, ddp::ready_sink{}); }
};
}  // namespace

TEST_CASE("P2 unchecked: a module that cannot report trains, every parameter counted as used") {
  // The same model, once reporting (forbid) and once silent (unchecked): the same bits, since
  // every parameter is used; a silent module under forbid does not compile
  // (tests/compile_fail/trainer_forbid_needs_reporting.cpp).
  auto run = [&]<class Module, class Unused>() {
    return ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) {
      Module model(test::make_mlp(4));
      ddp::host::device dev;
      ddp::trainer<Module, Unused, ddp::bucket_cap<256>> trainer(model, comm, dev, sgd);
      for (int s = 0; s < 2; ++s) {
        const auto b = test::make_batch(6, 30 + static_cast<std::uint64_t>(2 * s + comm.rank()));
        trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
      }
      CHECK(trainer.skipped_parameters().empty());
      return test::parameter_values(model);
    });
  };
  CHECK(run.template operator()<silent_mlp, ddp::unused_params::unchecked>() ==
        run.template operator()<test::unbound_mlp, ddp::unused_params::forbid>());
}

namespace {
// Declares that it reports ready gradients, and never does.
struct forgetful_mlp : test::unbound_mlp {
  using test::unbound_mlp::unbound_mlp;
  void backward(const ddp::nn::matrix& g, const ddp::ready_sink&) { test::unbound_mlp::backward(g, ddp::ready_sink{}); }
};
}  // namespace

TEST_CASE("P2: a module that declares reports_gradient_ready and never calls ready() is told so, not trained as "
          "unused (detect_each_step would leave every parameter as it was)") {
  auto o = on_ranks(2, [](auto& comm) {
    forgetful_mlp model(test::make_mlp(4));
    ddp::host::device dev;
    ddp::trainer<forgetful_mlp, ddp::unused_params::detect_each_step> trainer(model, comm, dev, sgd);
    const auto b = test::make_batch(6, 30 + static_cast<std::uint64_t>(comm.rank()));
    trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
  });
  for (const auto& e : o.errors)
    CHECK(contains(e, "the module reported no parameter ready in this step's backward, though it declares "
                      "reports_gradient_ready"));
}

TEST_CASE("P2 detect_each_step: a parameter used on some ranks is averaged over all, as one process") {
  // Rank 0 uses aux, rank 1 does not: one process sees aux on the first half of the global batch.
  test::branchy ref(5);
  test::reference_sgd ref_opt(ref, sgd);
  for (int s = 0; s < 3; ++s) {
    auto g = test::make_batch(12, 300 + s);
    for (int r = 0; r < 2; ++r) {
      auto half = g.rows(6 * r, 6 * r + 6);
      ref.use_aux = r == 0;
      auto ce = ddp::nn::softmax_cross_entropy(ref.forward(half.x), half.y);
      for (auto& v : ce.grad.data) v *= 0.5f;
      ref.backward(ce.grad, {});
    }
    ref_opt.step();
  }
  const auto expected = test::parameter_values(ref);
  auto got = ddp::inproc::launch(2, [](auto& comm) {
    test::branchy model(5);
    ddp::host::device dev;
    ddp::trainer<test::branchy, ddp::unused_params::detect_each_step> trainer(model, comm, dev, sgd);
    model.use_aux = comm.rank() == 0;
    for (int s = 0; s < 3; ++s) {
      auto half = test::make_batch(12, 300 + s).rows(6 * static_cast<std::size_t>(comm.rank()),
                                                     6 * static_cast<std::size_t>(comm.rank()) + 6);
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(half.x), half.y).grad); });
    }
    CHECK(trainer.skipped_parameters().empty());
    return test::parameter_values(model);
  });
  for (const auto& rank : got) CHECK(test::max_relative_error(rank, expected) <= 1e-5);
}

TEST_CASE("P2 detect_each_step and static_graph: a parameter unused on every rank is left untouched") {
  auto check = [](auto policy) {
    using policy_t = decltype(policy);
    ddp::inproc::launch(2, [](auto& comm) {
      test::branchy model(5);
      ddp::host::device dev;
      ddp::trainer<test::branchy, policy_t> trainer(model, comm, dev, sgd);
      const auto before = test::parameter_values(model);
      model.use_aux = false;
      for (int s = 0; s < 3; ++s) {
        auto b = test::make_batch(6, 400 + static_cast<std::uint64_t>(s * 2 + comm.rank()));
        trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
      }
      const auto after = test::parameter_values(model);
      INFO("unused_params::", policy_t::name);
      CHECK(after[2] == before[2]);  // aux.weight: no momentum, no weight decay
      CHECK(after[3] == before[3]);
      CHECK(after[0] != before[0]);  // trunk trained
      CHECK(trainer.skipped_parameters() == std::vector<std::string>{"aux.weight", "aux.bias"});
    });
  };
  check(ddp::unused_params::detect_each_step{});
  check(ddp::unused_params::static_graph{});
}

TEST_CASE("P2 static_graph: a change in the used set after the first step is an error naming the parameter") {
  auto o = on_ranks(2, [](auto& comm) {
    test::branchy model(5);
    ddp::host::device dev;
    ddp::trainer<test::branchy, ddp::unused_params::static_graph> trainer(model, comm, dev, sgd);
    for (int s = 0; s < 2; ++s) {
      model.use_aux = !(s == 1 && comm.rank() == 1);
      auto b = test::make_batch(6, 500 + static_cast<std::uint64_t>(s));
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    }
  });
  REQUIRE(o.all_threw());
  for (const auto& e : o.errors) {
    CAPTURE(e);
    CHECK(contains(e, "'aux.weight' (use changed on rank(s) 1)"));
    CHECK(contains(e, "static_graph"));
    CHECK(contains(e, "ddp::unused_params::detect_each_step"));
  }
}

namespace {
// Wraps a module and reports one parameter on another device, as a user who forgot to move it.
// A module whose third parameter claims another device, or another dtype, than it has.
struct misdescribed_module : test::branchy {
  using test::branchy::branchy;
  ddp::device_id claim = ddp::device_id::cpu();
  ddp::dtype claimed_type = ddp::dtype::f32;
  std::vector<ddp::parameter_ref> parameters() {
    auto refs = test::branchy::parameters();
    refs[2].value.device = claim;
    refs[2].value.type = refs[2].grad.type = claimed_type;
    return refs;
  }
};
}  // namespace

TEST_CASE("P3: a tensor on another device is named, with both devices, on every rank before any reduction") {
  auto o = on_ranks(2, [](auto& comm) {
    misdescribed_module model(5);
    if (comm.rank() == 1) model.claim = ddp::device_id::cuda(1);
    ddp::host::device dev;
    ddp::trainer<misdescribed_module> trainer(model, comm, dev, sgd);
  });
  REQUIRE(o.all_threw());
  for (const auto& e : o.errors) {
    CAPTURE(e);
    CHECK(contains(test::first_line(e), ": rank 1: parameter 'aux.weight' lives on cuda:1 but this rank's device is cpu; "
                                        "move the module to the rank's device before building the trainer"));
    CHECK(contains(test::first_line(e), "pitfall P3"));
  }
}

TEST_CASE("a parameter neither f32 nor 16-bit (f64) is an error on every rank naming it") {
  auto o = on_ranks(2, [](auto& comm) {
    misdescribed_module model(5);
    model.claimed_type = ddp::dtype::f64;
    ddp::host::device dev;
    ddp::trainer<misdescribed_module> trainer(model, comm, dev, sgd);
  });
  REQUIRE(o.all_threw());
  for (const auto& e : o.errors) {
    CAPTURE(e);
    CHECK(contains(e, "parameter 'aux.weight' is f64 with a f64 gradient"));
    CHECK(contains(e, "bf16 or f16 ones through an f32 master copy"));
  }
}

TEST_CASE("a parameter listed twice (a tied weight under two names) is an error on every rank naming both") {
  struct tied : test::unbound_mlp {
    using test::unbound_mlp::unbound_mlp;
    std::vector<ddp::parameter_ref> parameters() {
      auto refs = test::unbound_mlp::parameters();
      auto again = refs.back();
      again.name = "head.weight_tied";
      refs.push_back(again);
      return refs;
    }
  };
  auto o = on_ranks(2, [](auto& comm) {
    tied model(test::make_mlp(3));
    ddp::host::device dev;
    ddp::trainer<tied> trainer(model, comm, dev, sgd);
  });
  REQUIRE(o.all_threw());
  for (const auto& e : o.errors) {
    CAPTURE(e);
    CHECK(contains(e, "the module lists one storage under two names"));
    CHECK(contains(test::first_line(e), ": parameters '5.bias' and 'head.weight_tied' share storage"));
    CHECK(contains(test::first_line(e), "list a shared (tied) parameter once"));
  }
}

TEST_CASE("P5: ranks with different models fail on every rank, naming the first difference") {
  auto o = on_ranks(3, [](auto& comm) {
    auto hidden = comm.rank() == 2 ? 17u : 16u;
    test::mlp model(ddp::nn::linear(test::in_features, hidden, 1), test::tracked_affine(hidden), ddp::nn::relu(),
                    ddp::nn::linear(hidden, 12, 2), ddp::nn::relu(), ddp::nn::linear(12, test::classes, 3));
    ddp::host::device dev;
    ddp::trainer<test::mlp> trainer(model, comm, dev, sgd);
  });
  REQUIRE(o.all_threw());
  for (const auto& e : o.errors) {
    CAPTURE(e);
    CHECK(contains(test::first_line(e), ": rank 2: its model differs from rank 0's (pitfall P5): entry 0 is parameter "
                                        "'0.weight' f32 [17,6], but on rank 0 it is parameter '0.weight' f32 [16,6]"));
    CHECK(contains(e, "\n  ranks hold different models: build the same module"));
  }
}

namespace {
// What `f` writes to stderr (file descriptor 2), every thread's.
template <class F>
std::string stderr_of(F&& f) {
  std::fflush(stderr);
  std::FILE* file = std::tmpfile();
  const int saved = ::dup(2);
  ::dup2(::fileno(file), 2);
  f();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::string text;
  std::rewind(file);
  for (int c; (c = std::fgetc(file)) != EOF;) text.push_back(static_cast<char>(c));
  std::fclose(file);
  return text;
}
}  // namespace

TEST_CASE("P6: ranks built from other seeds are told, once, on rank 0, and ranks built alike are not") {
  auto build = [](bool same_seed) {
    ddp::inproc::launch(3, [&](auto& comm) {
      auto model = test::make_mlp(same_seed ? 100 : 100 + static_cast<std::uint64_t>(comm.rank()));
      ddp::host::device dev;
      ddp::trainer<test::mlp> trainer(model, comm, dev, sgd);
    });
  };
  const std::string told = stderr_of([&] { build(false); });
  CHECK(told == "ddp: rank(s) 1, 2 built the model with other parameter values than rank 0; every rank now starts "
                "from rank 0's (pitfall P6). Build it from the same seed on every rank to start from the same values "
                "knowingly.\n");
  CHECK(stderr_of([&] { build(true); }).empty());
}

TEST_CASE("P6: rank 0's weights reach every rank at construction, metrics are global") {
  auto results = ddp::inproc::launch(3, [](auto& comm) {
    auto model = test::make_mlp(100 + static_cast<std::uint64_t>(comm.rank()));  // different seeds
    ddp::host::device dev;
    ddp::trainer<test::mlp> trainer(model, comm, dev, sgd);
    ddp::metric loss;
    loss.add(static_cast<double>(comm.rank() + 1), 2.0);  // rank r saw 2 samples summing r+1
    const auto global = trainer.reduce(loss);
    CHECK(global.sum == 6.0);
    CHECK(global.count == 6.0);
    CHECK(global.mean() == 1.0);
    return test::parameter_values(model);
  });
  const auto rank0_init = test::parameter_values(*std::make_unique<test::mlp>(test::make_mlp(100)));
  for (const auto& r : results) CHECK(r == rank0_init);
}

TEST_CASE("no hang: a rank that throws in backward makes every rank raise, in bounded time") {
  struct exploding : test::branchy {
    using test::branchy::branchy;
    bool explode = false;
    void backward(const ddp::nn::matrix& g, const ddp::ready_sink& ready) {
      if (explode) throw std::runtime_error("NaN in backward of rank 1");
      test::branchy::backward(g, ready);
    }
  };
  auto o = on_ranks(4, [](auto& comm) {
    exploding model(5);
    model.explode = comm.rank() == 1;
    ddp::host::device dev;
    ddp::trainer<exploding> trainer(model, comm, dev, sgd);
    auto b = test::make_batch(6, 9);
    trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
  });
  REQUIRE(o.all_threw());
  CHECK(o.seconds < 20.0);
  CHECK(o.errors[1] == "NaN in backward of rank 1");
  for (int r : {0, 2, 3}) CHECK(contains(o.errors[static_cast<std::size_t>(r)], "rank 1 failed: NaN in backward of rank 1"));
}

TEST_CASE("join() after accumulate() without step() is an error that says so, on every rank") {
  auto o = on_ranks(2, [](auto& comm) {
    test::branchy model(5);
    ddp::host::device dev;
    ddp::trainer<test::branchy> trainer(model, comm, dev, sgd);
    auto b = test::make_batch(4, 1);
    if (comm.rank() == 0)
      trainer.accumulate([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    trainer.join();
  });
  REQUIRE(o.all_threw());
  CHECK(contains(o.errors[0], "1 accumulate() micro-batch(es) have no step(); finish them with step() before join()"));
  CHECK(contains(o.errors[1], "rank 0 failed"));
}

TEST_CASE("a forward without its backward is an error that says so") {
  auto o = on_ranks(1, [](auto& comm) {
    test::branchy model(5);
    ddp::host::device dev;
    ddp::trainer<test::branchy> trainer(model, comm, dev, sgd);
    auto b = test::make_batch(4, 1);
    trainer.step([&](auto& r) { (void)r.forward(b.x); });
  });
  CHECK(contains(o.errors[0], "1 forward(s) in this step had no backward"));
}

TEST_CASE("step() or accumulate() called from inside a step's function is an error that says so, on every rank") {
  for (const bool nested_step : {true, false}) {
    auto o = on_ranks(2, [&](auto& comm) {
      test::branchy model(5);
      ddp::host::device dev;
      ddp::trainer<test::branchy> trainer(model, comm, dev, sgd);
      auto b = test::make_batch(4, 1);
      auto pair = [&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); };
      trainer.step([&](auto& r) {
        pair(r);
        if (nested_step) trainer.step(pair);
        else trainer.accumulate(pair);
      });
    });
    CAPTURE(nested_step);
    for (const auto& e : o.errors)
      CHECK(contains(e, "called inside the function of a step() or accumulate(), whose micro-batch has not ended"));
  }
}

TEST_CASE("a second trainer on a module that has one is refused by name, and once the first is gone one may be built") {
  auto o = on_ranks(2, [](auto& comm) {
    test::branchy model(5);
    ddp::host::device dev;
    {
      ddp::trainer<test::branchy> first(model, comm, dev, sgd);
      try {
        ddp::trainer<test::branchy> second(model, comm, dev, sgd);
        FAIL("a second trainer was built on the module");
      } catch (const ddp::error& e) {
        CHECK(contains(e.what(), "this module already has a trainer"));
      }
    }
    ddp::trainer<test::branchy> again(model, comm, dev, sgd);
  });
  for (const auto& e : o.errors) CHECK(e.empty());
}

TEST_CASE("buckets: reverse parameter order under the byte cap, reductions overlap backward") {
  ddp::inproc::launch(2, [](auto& comm) {
    auto model = test::make_mlp(1);
    ddp::host::device dev;
    ddp::trainer<test::mlp, ddp::bucket_cap<200>> trainer(model, comm, dev, sgd);
    // Parameters, last first: 0.weight 96, 0.bias 16, 1.weight 16, 1.bias 16, 3.weight 192,
    // 3.bias 12, 5.weight 36, 5.bias 3 floats; 200 bytes hold 50 floats; each parameter starts
    // at a multiple of 4 floats (5.weight at 4).
    CHECK(trainer.bucket_sizes() == std::vector<std::size_t>{40, 12, 192, 48, 96});
    auto b = test::make_batch(8, 3);
    trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    const auto& t = trainer.last_step_overlap();
    CHECK(t.measured);  // the in-process work handles carry timing
    CHECK(t.reduction_seconds > 0.0);
    CHECK(t.overlapped_seconds >= 0.0);
    CHECK(t.overlapped_seconds <= t.reduction_seconds);
  });
}

}  // namespace trainer_pitfalls_test
