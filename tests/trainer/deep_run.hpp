#pragma once
// A few steps of the ten-bucket model (test::deep_mlp under bucket_cap<2400>) on in-process ranks,
// for the update strategies' tests (zero_test.cpp, overlap_test.cpp): each rank's parameters as
// the module holds them, and whether its last step waited for a reduction inside its update.
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/policy/powersgd.hpp"
#include "trainer/equivalence.hpp"
#include "trainer/test_model.hpp"

namespace test {

struct deep_run_options {
  bool micro_batches = false;  // a step is two micro-batches of 4 samples, else one of 8
  bool bf16 = false;           // the module's parameters in bf16 (the trainer keeps an f32 master)
  bool overlap = false;        // trainer.overlap_optimizer
  float clip = 0.0f;           // > 0: clip_gradient_norm
  int join_after = 0;          // > 0: rank r runs join_after + r steps of its own, then joins; else 3 steps
};

struct deep_run {
  std::vector<std::vector<float>> params;
  bool waited_inside_update = false;  // the last step waited for a reduction inside its update
};

// Whether a step recorded in `t` waited for a reduction inside its update phase.
inline bool waits_inside_update(const ddp::timeline& t) {
  const auto& events = t.events();
  const auto update = std::ranges::find(events, std::string("update"), &ddp::timeline_event::name);
  if (update == events.end()) return false;
  return std::ranges::any_of(events, [&](const ddp::timeline_event& e) {
    return e.name == "wait for reductions" && e.begin >= update->begin && e.end <= update->end;
  });
}

template <class Update, class Optimizer, class... More>
std::vector<deep_run> train_deep(int world, deep_run_options o) {
  return ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
    auto model = make_deep_mlp();
    if (o.bf16) model.cast_parameters(ddp::dtype::bf16);
    ddp::host::device dev;
    ddp::trainer<deep_mlp, Update, Optimizer, ddp::bucket_cap<2400>, More...> trainer(
        model, comm, dev, equivalence::settings<Optimizer>());
    if constexpr ((std::is_same_v<More, ddp::comm_hook::powersgd<1>> || ...))
      trainer.template policy<ddp::comm_hook::slot>().start_after = 0;  // compressed from the first step
    trainer.overlap_optimizer(o.overlap);
    if (o.clip > 0) trainer.clip_gradient_norm(o.clip);
    const int steps = o.join_after ? o.join_after + comm.rank() : 3;
    ddp::timeline timeline;
    for (int s = 0; s < steps; ++s) {
      if (s + 1 == steps) trainer.record_timeline(&timeline);
      const auto b = make_batch(8, 100 + static_cast<std::uint64_t>(10 * s + comm.rank()));
      auto on = [](const batch& x) {
        return [&x](auto& r) { r.backward(ddp::nn::softmax_cross_entropy(r.forward(x.x), x.y).grad); };
      };
      if (o.micro_batches) {
        const auto first = b.rows(0, 4), second = b.rows(4, 8);
        trainer.accumulate(on(first));
        trainer.step(on(second));
      } else {
        trainer.step(on(b));
      }
    }
    trainer.record_timeline(nullptr);
    if (o.join_after) trainer.join();
    trainer.gather_parameters();  // update::fully_sharded: the module holds its parameters only when gathered
    return deep_run{held_values(model), waits_inside_update(timeline)};
  });
}

// Each rank's parameters alone.
inline std::vector<std::vector<std::vector<float>>> params_of(const std::vector<deep_run>& runs) {
  std::vector<std::vector<std::vector<float>>> params;
  for (const auto& r : runs) params.push_back(r.params);
  return params;
}

}  // namespace test
