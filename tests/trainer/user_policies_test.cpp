// Every slot takes a policy written outside the library (tests/support/user_policies.hpp), and
// the trainer runs it: each test checks that the policy does what it says.
#include <doctest/doctest.h>

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/inproc/launch.hpp"
#include "support/on_ranks.hpp"
#include "support/user_policies.hpp"
#include "trainer/invariance.hpp"
#include "trainer/test_model.hpp"

namespace trainer_user_policies_test {

namespace {

struct rank_state {
  std::vector<std::vector<float>> params;
  std::vector<std::vector<float>> buffers;  // f32 buffers' values
};

template <class Module>
rank_state state_of(Module& m) {
  rank_state s{test::parameter_values(m), {}};
  for (auto& b : m.buffers()) {
    ddp::buffer_ref r = b;
    if (r.value.type != ddp::dtype::f32) continue;
    auto v = r.value.template as<float>();
    s.buffers.emplace_back(v.begin(), v.end());
  }
  return s;
}

const auto nothing = [](auto&) {};

// `steps` steps of test::mlp on `world` ranks, each rank with its own batch; `setup(trainer)` runs
// on every rank before them, `inspect(trainer)` after. Returns every rank's state.
template <class... Policies, class Optimizer = ddp::optim::sgd, class Setup = decltype(nothing),
          class Inspect = decltype(nothing)>
std::vector<rank_state> train(int world, int steps, Setup setup = nothing, Inspect inspect = nothing,
                              Optimizer opt = {.lr = 0.05f, .momentum = 0.9f}) {
  return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(11);
    ddp::host::device dev;
    ddp::trainer<test::mlp, Policies...> trainer(model, comm, dev, opt);
    setup(trainer);
    for (int s = 0; s < steps; ++s) {
      const auto b = test::make_batch(8, 300 + static_cast<std::uint64_t>(10 * s + comm.rank()));
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    }
    inspect(trainer);
    return state_of(model);
  });
}

void check_same(const std::vector<rank_state>& a, const std::vector<rank_state>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t r = 0; r < a.size(); ++r) {
    CAPTURE(r);
    CHECK(a[r].params == b[r].params);
    CHECK(a[r].buffers == b[r].buffers);
  }
}

}  // namespace

TEST_CASE("a user's BufferSync (every k steps) syncs on the steps it says, and only then") {
  // k = 1 is broadcast_once_per_step, bit for bit.
  check_same(train<user::every_k_steps>(2, 3, [](auto& t) { t.template policy<ddp::buffer_sync::slot>().k = 1; }),
             train<ddp::buffer_sync::broadcast_once_per_step>(2, 3));
  // Over 3 steps, k = 3 syncs only before step 0, when the buffers are still rank 0's from
  // construction: the same as no sync at all.
  check_same(train<user::every_k_steps>(2, 3, [](auto& t) { t.template policy<ddp::buffer_sync::slot>().k = 3; }),
             train<ddp::buffer_sync::none>(2, 3));
  // k = 2 over 5 steps: steps 0, 2, 4; then synchronize_buffers() once more.
  auto syncs = ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(11);
    ddp::host::device dev;
    ddp::trainer<test::mlp, user::every_k_steps> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.05f});
    trainer.policy<ddp::buffer_sync::slot>().k = 2;
    for (int s = 0; s < 5; ++s) {
      const auto b = test::make_batch(8, 7 + static_cast<std::uint64_t>(s));
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    }
    const int during_steps = trainer.policy<ddp::buffer_sync::slot>().syncs;
    trainer.synchronize_buffers();
    return std::pair{during_steps, trainer.policy<ddp::buffer_sync::slot>().syncs};
  });
  for (const auto& [during, after] : syncs) {
    CHECK(during == 3);
    CHECK(after == 4);
  }
  CHECK(std::string(ddp::trainer<test::mlp, user::every_k_steps>::describe_policies()).find("buffer_sync=every_k_steps") !=
        std::string::npos);
}

TEST_CASE("a user's UnusedParamDetection (log and continue) logs what no rank used and trains as detect_each_step") {
  auto run = [&]<class Unused>() {
    return ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) {
      test::branchy model(5);
      ddp::host::device dev;
      ddp::trainer<test::branchy, Unused> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.1f, .momentum = 0.9f});
      for (int s = 0; s < 3; ++s) {
        model.use_aux = s == 0 || (s == 1 && comm.rank() == 1);  // step 2: no rank uses aux
        const auto b = test::make_batch(6, 20 + static_cast<std::uint64_t>(s * 2 + comm.rank()));
        trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
      }
      std::vector<std::string> log;
      if constexpr (std::is_same_v<Unused, user::log_unused>) log = trainer.template policy<ddp::unused_params::slot>().log;
      return std::pair{test::parameter_values(model), log};
    });
  };
  const auto logged = run.template operator()<user::log_unused>();
  const auto detected = run.template operator()<ddp::unused_params::detect_each_step>();
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(logged[r].first == detected[r].first);
    CHECK(logged[r].second == std::vector<std::string>{"aux.weight", "aux.bias"});
  }
}

TEST_CASE("a user's optimizer (Lion) runs on the host device: one rank equals Lion by hand, two ranks the global batch") {
  const user::lion lion{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.99f, .weight_decay = 0.1f};
  constexpr int steps = 3;
  // By hand: one process, the whole batch, Lion written out per element.
  auto model = test::make_mlp(11);
  std::vector<std::vector<float>> momentum;
  for (auto& p : model.parameters()) momentum.emplace_back(p.value.numel(), 0.0f);
  for (int s = 0; s < steps; ++s) {
    auto b = test::make_batch(16, 900 + static_cast<std::uint64_t>(s));
    model.backward(ddp::nn::softmax_cross_entropy(model.forward(b.x), b.y).grad, ddp::ready_sink{});
    std::size_t i = 0;
    for (auto& p : model.parameters()) {
      auto v = p.value.as<float>();
      auto g = p.grad.as<float>();
      auto& m = momentum[i++];
      for (std::size_t k = 0; k < v.size(); ++k) {
        const float c = lion.beta1 * m[k] + (1.0f - lion.beta1) * g[k];
        v[k] = v[k] * (1.0f - lion.lr * lion.weight_decay) - lion.lr * static_cast<float>((c > 0.0f) - (c < 0.0f));
        m[k] = lion.beta2 * m[k] + (1.0f - lion.beta2) * g[k];
        g[k] = 0.0f;
      }
    }
  }
  const auto by_hand = test::parameter_values(model);
  auto on = [&](int world) {
    return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
      auto m = test::make_mlp(11);
      ddp::host::device dev;
      ddp::trainer<test::mlp, user::lion, ddp::bucket_cap<512>> trainer(m, comm, dev, lion);
      const std::size_t per = 16 / static_cast<std::size_t>(world), r = static_cast<std::size_t>(comm.rank());
      for (int s = 0; s < steps; ++s) {
        const auto b = test::make_batch(16, 900 + static_cast<std::uint64_t>(s)).rows(r * per, (r + 1) * per);
        trainer.step([&](auto& rep) { rep.backward(ddp::nn::softmax_cross_entropy(rep.forward(b.x), b.y).grad); });
      }
      CHECK(trainer.optimizer().lr == lion.lr);
      return test::parameter_values(m);
    });
  };
  CHECK(on(1)[0] == by_hand);
  for (const auto& rank : on(2)) CHECK(test::max_relative_error(rank, by_hand) <= 1e-4);
}

TEST_CASE("a user's bucket policy (small first bucket) shapes the buckets and leaves the numbers alone") {
  std::vector<std::size_t> sizes;
  const auto small = train<user::small_first_bucket<64, 2048>>(2, 2, [&](auto& t) {
    if (t.communicator().rank() == 0) sizes = t.bucket_sizes();  // one writer: the ranks are threads
  });
  // Last parameters first: 5.bias (3 floats) alone would fit 16 floats, 5.weight (36) does not.
  REQUIRE(sizes.size() >= 2);
  CHECK(sizes[0] <= 16);
  CHECK(sizes[1] > 16);
  check_same(small, train<ddp::bucket_cap<std::size_t{25} << 20>>(2, 2));
}

TEST_CASE("a user's update policy (page-aligned shards) gives the bits of update::replicated") {
  check_same(train<user::page_sharded>(3, 3), train<ddp::update::replicated>(3, 3));
  const ddp::optim::adamw adamw{.lr = 1e-2f};
  check_same(train<user::page_sharded, ddp::optim::adamw>(2, 3, nothing, nothing, adamw),
             train<ddp::update::replicated, ddp::optim::adamw>(2, 3, nothing, nothing, adamw));
}

TEST_CASE("a user's sampler hands each rank the indices it says") {
  auto indices = ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(1);
    ddp::host::device dev;
    ddp::trainer<test::mlp, user::reversed_blocks> trainer(model, comm, dev);
    return trainer.next_epoch_indices(11);
  });
  CHECK(indices[0] == std::vector<std::size_t>{10, 9, 8, 7, 6});
  CHECK(indices[1] == std::vector<std::size_t>{5, 4, 3, 2, 1});
}

namespace {

// A bucket policy whose plan the trainer must refuse: `fault` says what is wrong with it.
enum class plan_fault { shared_slot, short_slots, past_bucket, listed_twice };
template <plan_fault Fault>
struct faulty_plan {
  using slot = ddp::buckets::slot;
  static constexpr std::string_view name = "faulty_plan";
  ddp::bucket_plan plan(std::span<const std::size_t> numels) const {
    auto p = ddp::plan_buckets(numels, [](std::size_t) { return std::size_t{1} << 20; });  // one bucket
    if constexpr (Fault == plan_fault::shared_slot) p.slots[1].offset = p.slots[0].offset;
    if constexpr (Fault == plan_fault::short_slots) p.slots.pop_back();
    if constexpr (Fault == plan_fault::past_bucket) p.slots[0].offset = p.sizes[0];
    if constexpr (Fault == plan_fault::listed_twice) p.buckets[0].push_back(p.buckets[0].front());
    return p;
  }
  std::string describe() const { return "faulty"; }
};

// An update policy that gathers parameters but puts this rank's shard where all_gather will not.
struct misplaced_shards : ddp::update::sharded {
  static constexpr std::string_view name = "misplaced_shards";
  ddp::update::layout plan(std::size_t numel, int rank, int ranks) const {
    auto l = sharded::plan(numel, rank, ranks);
    l.begin = static_cast<std::size_t>(ranks - 1 - rank) * l.shard;  // reversed
    return l;
  }
};

template <class Policy>
std::string construction_error(int world) {
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(3);
    ddp::host::device dev;
    try {
      ddp::trainer<test::mlp, Policy> trainer(model, comm, dev);
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  for (const auto& e : errors) CHECK(e.empty() == errors.front().empty());  // every rank raises it, none hangs
  return errors.front();
}

}  // namespace

TEST_CASE("a user's bucket plan or update layout that would write out of place is refused, naming the parameter or bucket") {
  auto says = [](const std::string& error, std::string_view part) {
    INFO(error);
    CHECK(error.find(part) != std::string::npos);
  };
  // test::mlp's parameters in order: 0.weight (16 x 6), 0.bias, 1.weight, 1.bias, 3.weight, ...
  const auto shared = construction_error<faulty_plan<plan_fault::shared_slot>>(2);
  says(shared, "overlapping places in bucket 0");
  says(shared, "'0.weight'");
  says(shared, "'0.bias'");
  says(construction_error<faulty_plan<plan_fault::short_slots>>(1), "places 7 parameter(s), but the module has 8");
  says(construction_error<faulty_plan<plan_fault::past_bucket>>(1), "places parameter '0.weight' (96 elements) at offset");
  says(construction_error<faulty_plan<plan_fault::listed_twice>>(1), "2 times");
  const auto layout = construction_error<misplaced_shards>(2);
  says(layout, "the update policy 'misplaced_shards' lays out bucket 0");
  says(layout, "rank r's starting at r x shard");
  CHECK(construction_error<misplaced_shards>(1).empty());  // one rank: its shard is where it belongs
}

namespace {

// test::mlp with an empty parameter last: plan_buckets gives it the place of the parameter
// before it (0 elements there take nothing).
class mlp_with_empty {
 public:
  using input_type = ddp::nn::matrix;
  using output_type = ddp::nn::matrix;
  static constexpr bool reports_gradient_ready = true;

  explicit mlp_with_empty(test::mlp m) : m_(std::move(m)) {}
  std::vector<ddp::parameter_ref> parameters() {
    auto refs = m_.parameters();
    refs.push_back(empty_.ref(""));
    return refs;
  }
  std::vector<ddp::buffer_ref> buffers() { return m_.buffers(); }
  ddp::nn::matrix forward(const ddp::nn::matrix& x) { return m_.forward(x); }
  void backward(const ddp::nn::matrix& g, const ddp::ready_sink& ready) {
    ready(m_.parameters().size());  // nothing to compute for it
    m_.backward(g, ready);
  }

 private:
  test::mlp m_;
  ddp::nn::parameter empty_{"empty", ddp::shape_t{0}};
};

}  // namespace

TEST_CASE("a module with an empty parameter trains as the same module without it, replicated and sharded") {
  auto run = [](auto with_empty, auto update) {
    using module_type = std::conditional_t<decltype(with_empty)::value, mlp_with_empty, test::unbound_mlp>;
    return ddp::inproc::launch(2, [&](ddp::inproc::communicator& comm) {
      module_type model(test::make_mlp(5));
      ddp::host::device dev;
      ddp::trainer<module_type, decltype(update)> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.1f});
      const std::size_t r = static_cast<std::size_t>(comm.rank());
      for (int s = 0; s < 3; ++s) {
        auto b = test::make_batch(16, 300 + s).rows(r * 8, (r + 1) * 8);
        trainer.step([&](auto& rep) { rep.backward(ddp::nn::softmax_cross_entropy(rep.forward(b.x), b.y).grad); });
      }
      auto values = test::parameter_values(model);
      if (values.back().empty()) values.pop_back();
      return values;
    });
  };
  CHECK(run(std::true_type{}, ddp::update::replicated{}) == run(std::false_type{}, ddp::update::replicated{}));
  CHECK(run(std::true_type{}, ddp::update::sharded{}) == run(std::false_type{}, ddp::update::sharded{}));
}

TEST_CASE("a sampler is a value: the trainer deals the epochs through its own sampler object, state included") {
  const auto dealt = ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(1);
    ddp::host::device dev;
    ddp::trainer<test::mlp, user::every_kth> trainer(model, comm, dev);
    trainer.policy<ddp::sampler::slot>().k = 3;
    CHECK(trainer.steps_per_epoch(30, 2) == 2);  // 5 indices a rank, whole batches of 2
    return trainer.next_epoch_indices(30);
  });
  CHECK(dealt[0] == std::vector<std::size_t>{0, 6, 12, 18, 24});
  CHECK(dealt[1] == std::vector<std::size_t>{3, 9, 15, 21, 27});
}

TEST_CASE("a user's reduction policy (four virtual shards) gives the same bits at 1, 2, 3 and 4 ranks") {
  const ddp::optim::sgd opt{.lr = 0.1f, .momentum = 0.9f};
  const auto one = invariance::train<user::four_shards, ddp::update::replicated>(1, opt)[0];
  for (int world : {2, 3, 4})
    for (const auto& rank : invariance::train<user::four_shards, ddp::update::replicated>(world, opt))
      CHECK(invariance::bitwise_equal(rank, one));
}

namespace {
using sync_choice = ddp::buffer_sync::one_of<ddp::buffer_sync::broadcast_once_per_step, ddp::buffer_sync::none,
                                             ddp::buffer_sync::average_once_per_step>;
using unused_choice = ddp::unused_params::one_of<ddp::unused_params::forbid, ddp::unused_params::detect_each_step,
                                                 ddp::unused_params::static_graph>;

auto choose(std::string sync, std::string unused) {
  return [=](auto& t) {
    t.template policy<ddp::buffer_sync::slot>().select(sync);
    t.template policy<ddp::unused_params::slot>().select(unused);
  };
}

// A buffer sync that counts its calls, to see when a one_of prepares it.
struct prepare_probe {
  using slot = ddp::buffer_sync::slot;
  static constexpr std::string_view name = "prepare_probe";
  int prepared = 0;
  int prepared_before_first_forward = -1;
  void prepare(ddp::buffer_sync::context&) { ++prepared; }
  void before_forward(ddp::buffer_sync::context&) {
    if (prepared_before_first_forward < 0) prepared_before_first_forward = prepared;
  }
  void synchronize(ddp::buffer_sync::context&) {}
};
}  // namespace

TEST_CASE("one_of: policies chosen while the program runs train as the policies themselves, bit for bit") {
  check_same(train<sync_choice, unused_choice>(3, 3, choose("none", "static_graph")),
             train<ddp::buffer_sync::none, ddp::unused_params::static_graph>(3, 3));
  check_same(train<sync_choice, unused_choice>(3, 3, choose("average_once_per_step", "detect_each_step")),
             train<ddp::buffer_sync::average_once_per_step, ddp::unused_params::detect_each_step>(3, 3));
  // The trainer, and so its checkpoints, name the policies chosen, as the policies themselves do.
  ddp::inproc::launch(1, [](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(11);
    ddp::host::device dev;
    ddp::trainer<test::mlp, sync_choice, unused_choice> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.05f});
    choose("none", "static_graph")(trainer);
    auto same_model = test::make_mlp(11);
    ddp::trainer<test::mlp, ddp::buffer_sync::none, ddp::unused_params::static_graph> fixed(same_model, comm, dev,
                                                                                          ddp::optim::sgd{.lr = 0.05f});
    CHECK(trainer.describe() == fixed.describe());
    CHECK(test::contains(trainer.describe(), "buffer_sync=none, unused_params=static_graph"));
  });
}

TEST_CASE("one_of: the chosen unused-parameter policy decides, over buckets planned for any choice") {
  // forbid: a parameter one rank skipped is an error naming it, on every rank.
  const auto o = test::on_ranks(2, [](ddp::inproc::communicator& comm) {
    test::branchy model(5);
    ddp::host::device dev;
    ddp::trainer<test::branchy, unused_choice> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.05f});
    trainer.policy<ddp::unused_params::slot>().select("forbid");
    model.use_aux = comm.rank() == 0;
    const auto b = test::make_batch(6, 20 + static_cast<std::uint64_t>(comm.rank()));
    trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
  });
  REQUIRE(o.all_threw());
  for (const auto& e : o.errors) CHECK(test::contains(e, "'aux.weight' (no gradient on rank(s) 1)"));
  // static_graph after forbid's first steps: it learns the set in its own first step and then
  // leaves the parameter no rank uses untouched.
  ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) {
    test::branchy model(5);
    ddp::host::device dev;
    ddp::trainer<test::branchy, unused_choice> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.05f});
    auto step = [&](int s) {
      const auto b = test::make_batch(6, 400 + static_cast<std::uint64_t>(s * 2 + comm.rank()));
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    };
    step(0);  // forbid, every parameter used
    trainer.policy<ddp::unused_params::slot>().select("static_graph");
    model.use_aux = false;
    const auto before = test::parameter_values(model);
    for (int s = 1; s < 4; ++s) step(s);
    const auto after = test::parameter_values(model);
    CHECK(after[0] != before[0]);
    CHECK(after[2] == before[2]);
    CHECK(trainer.skipped_parameters() == std::vector<std::string>{"aux.weight", "aux.bias"});
  });
}

namespace {

template <class Trainer>
void train_step(Trainer& trainer, int rank, int step) {
  const auto b = test::make_batch(6, 20 + static_cast<std::uint64_t>(10 * step + rank));
  trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
}

// Every rank's error, without its "ddp[trainer] <operation> on rank r: " prefix, is the same.
std::string same_detail(const test::ranks_outcome& o, const std::string& operation) {
  std::string first;
  for (std::size_t r = 0; r < o.errors.size(); ++r) {
    const std::string prefix = "ddp[trainer] " + operation + " on rank " + std::to_string(r) + ": ";
    CAPTURE(o.errors[r]);
    CHECK(o.errors[r].rfind(prefix, 0) == 0);
    const std::string detail = o.errors[r].substr(std::min(prefix.size(), o.errors[r].size()));
    if (r == 0) first = detail;
    CHECK(detail == first);
  }
  return first;
}

}  // namespace

TEST_CASE("policy agreement: one_of choices that differ per rank are one error on every rank, naming each slot and side") {
  const auto o = test::on_ranks(3, [](ddp::inproc::communicator& comm) {
    test::branchy model(5);
    ddp::host::device dev;
    ddp::trainer<test::branchy, unused_choice, sync_choice> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.05f});
    trainer.policy<ddp::unused_params::slot>().select(comm.rank() == 1 ? "static_graph" : "forbid");
    trainer.policy<ddp::buffer_sync::slot>().select(comm.rank() == 2 ? "none" : "broadcast_once_per_step");
    train_step(trainer, comm.rank(), 0);
  });
  REQUIRE(o.all_threw());
  const auto detail = same_detail(o, "step");
  CHECK(test::first_line(detail) ==
        "ranks run different policies in slot buffer_sync: ranks 0, 1 run 'broadcast_once_per_step'; rank 2 runs 'none'");
  CHECK(test::contains(detail, "\n  and in slot unused_params: ranks 0, 2 run 'forbid'; rank 1 runs 'static_graph'\n"));
  CHECK(test::contains(detail, "select a one_of's policy alike on every rank, before the same step"));
}

TEST_CASE("policy agreement: a select() between steps is agreed on at the next step, alike or not") {
  // Every rank selects alike: training goes on. Then rank 0 selects another policy than the others.
  std::vector<std::vector<float>> before(3), after(3);
  const auto o = test::on_ranks(3, [&](ddp::inproc::communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    test::branchy model(5);
    ddp::host::device dev;
    ddp::trainer<test::branchy, unused_choice> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.05f});
    train_step(trainer, comm.rank(), 0);
    trainer.policy<ddp::unused_params::slot>().select("detect_each_step");
    train_step(trainer, comm.rank(), 1);
    trainer.policy<ddp::unused_params::slot>().select(comm.rank() == 0 ? "static_graph" : "forbid");
    before[r] = test::parameter_values(model)[0];
    try {
      train_step(trainer, comm.rank(), 2);
    } catch (...) {
      after[r] = test::parameter_values(model)[0];
      throw;
    }
  });
  REQUIRE(o.all_threw());
  CHECK(test::first_line(same_detail(o, "step")) ==
        "ranks run different policies in slot unused_params: rank 0 runs 'static_graph'; ranks 1, 2 run 'forbid'");
  for (std::size_t r = 0; r < 3; ++r) CHECK(after[r] == before[r]);  // the step did not begin
}

TEST_CASE("policy agreement: trainers of different policy lists (forbid against static_graph) are refused at construction") {
  // Without the agreement, the first step's reduction would differ in size (forbid sends more
  // control floats), a mismatch that names no policy. (As one_of choices they issue the same
  // collectives: the first case.)
  const auto o = test::on_ranks(3, [](ddp::inproc::communicator& comm) {
    test::branchy model(5);
    ddp::host::device dev;
    auto build = [&]<class Unused>() {
      ddp::trainer<test::branchy, Unused> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.05f});
      train_step(trainer, comm.rank(), 0);
    };
    if (comm.rank() == 1) build.template operator()<ddp::unused_params::static_graph>();
    else build.template operator()<ddp::unused_params::forbid>();
  });
  REQUIRE(o.all_threw());
  const auto detail = same_detail(o, "construct");
  CHECK(test::first_line(detail) ==
        "ranks run different policies in slot unused_params: ranks 0, 2 run 'forbid'; rank 1 runs 'static_graph'");
  CHECK(test::contains(detail, "build every rank's trainer with the same policy list"));
}

TEST_CASE("one_of: an unknown name lists the choices, and a policy chosen is prepared before its first use") {
  ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(11);
    ddp::host::device dev;
    ddp::trainer<test::mlp, ddp::buffer_sync::one_of<ddp::buffer_sync::none, prepare_probe>> trainer(
        model, comm, dev, ddp::optim::sgd{.lr = 0.05f});
    auto& sync = trainer.policy<ddp::buffer_sync::slot>();
    CHECK_THROWS_WITH_AS(sync.select("broadcast"),
                         "ddp: buffer_sync::one_of has no policy named 'broadcast'; choose one of none, prepare_probe",
                         std::invalid_argument);
    CHECK(sync.selected() == "none");  // a failed select keeps the choice
    sync.select("prepare_probe");
    const auto b = test::make_batch(8, 3 + static_cast<std::uint64_t>(comm.rank()));
    for (int s = 0; s < 2; ++s)
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    const auto* probe = std::get_if<prepare_probe>(&sync.chosen);
    REQUIRE(probe != nullptr);
    CHECK(probe->prepared == 1);
    CHECK(probe->prepared_before_first_forward == 1);
  });
}


namespace {
// A hook of the user's that leaves the gradients to the update policy's collective, and says so.
struct user_plain_hook {
  using slot = ddp::comm_hook::slot;
  static constexpr std::string_view name = "user_plain";
  static constexpr bool plain = true;
  void reduce(ddp::comm_hook::bucket_io& b) { b.reduce_gradients(); }
  void finish(ddp::comm_hook::bucket_io&) {}
};
}  // namespace

TEST_CASE("a hook that declares itself plain, and one_of<none>, are taken where none is, and read as none") {
  using invariant = ddp::reduction::invariant<4>;
  static_assert(ddp::detail::trainer_policies<test::mlp, invariant, user_plain_hook>::valid);
  static_assert(ddp::detail::trainer_policies<test::mlp, invariant, ddp::comm_hook::one_of<ddp::comm_hook::none>>::valid);
  static_assert(!ddp::comm_hook::is_plain<ddp::comm_hook::one_of<ddp::comm_hook::none, ddp::comm_hook::bf16>>());
  const auto plain = ddp::trainer<test::mlp>::describe_policies();
  CHECK(ddp::trainer<test::mlp, user_plain_hook>::describe_policies() == plain);
  CHECK(ddp::trainer<test::mlp, ddp::comm_hook::one_of<ddp::comm_hook::none>>::describe_policies() == plain);
  check_same(train<user_plain_hook>(3, 3), train<>(3, 3));
}

namespace {
// A hook that says it is plain but reduces the gradients itself: the control floats that were
// routed into the plain all_reduce would go nowhere.
struct false_plain_hook {
  using slot = ddp::comm_hook::slot;
  static constexpr std::string_view name = "false_plain";
  static constexpr bool plain = true;
  void reduce(ddp::comm_hook::bucket_io& b) {
    b.reduce_like_gradients({b.gradients(), b.size(), ddp::dtype::f32}, ddp::reduce_op::avg);
  }
  void finish(ddp::comm_hook::bucket_io&) {}
};
}  // namespace

TEST_CASE("a hook that declares plain but does not call reduce_gradients is an error naming it, on every rank") {
  const auto messages = ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(11);
    ddp::host::device dev;
    ddp::trainer<test::mlp, false_plain_hook> trainer(model, comm, dev, ddp::optim::sgd{.lr = 0.05f});
    const auto b = test::make_batch(8, 300 + static_cast<std::uint64_t>(comm.rank()));
    try {
      trainer.step([&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); });
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  });
  for (const auto& m : messages) {
    CAPTURE(m);
    CHECK(m.find("comm hook 'false_plain' declares `plain`") != std::string::npos);
    CHECK(m.find("reduce_gradients()") != std::string::npos);
  }
}

namespace {
// A hook that records the step each call of it sees, launches and completions alike.
struct step_recording_hook {
  using slot = ddp::comm_hook::slot;
  static constexpr std::string_view name = "step_recording";
  std::vector<std::uint64_t> reduced, finished;
  void reduce(ddp::comm_hook::bucket_io& b) {
    reduced.push_back(b.step());
    b.reduce_gradients();
  }
  void finish(ddp::comm_hook::bucket_io& b) { finished.push_back(b.step()); }
};
}  // namespace

TEST_CASE("a hook sees the trainer's step count when its bucket launches and when it completes") {
  const auto seen = ddp::inproc::launch(2, [](ddp::inproc::communicator& comm) {
    auto model = test::make_mlp(11);
    ddp::host::device dev;
    ddp::trainer<test::mlp, step_recording_hook, ddp::bucket_cap<256>> trainer(model, comm, dev,
                                                                              ddp::optim::sgd{.lr = 0.05f});
    for (std::uint64_t s = 0; s < 3; ++s) {
      const auto b = test::make_batch(8, 300 + s * 2 + static_cast<std::uint64_t>(comm.rank()));
      auto run = [&](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(b.x), b.y).grad); };
      trainer.accumulate(run);  // no collective
      trainer.step(run);
    }
    const auto& hook = trainer.policy<ddp::comm_hook::slot>();
    return std::make_pair(trainer.bucket_count(), std::make_pair(hook.reduced, hook.finished));
  });
  for (const auto& [buckets, calls] : seen) {
    REQUIRE(buckets > 1);
    std::vector<std::uint64_t> expected;
    for (std::uint64_t s = 0; s < 3; ++s) expected.insert(expected.end(), buckets, s);
    CHECK(calls.first == expected);
    CHECK(calls.second == expected);
  }
}

}  // namespace trainer_user_policies_test
