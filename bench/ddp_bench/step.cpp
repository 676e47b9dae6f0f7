// ddp-bench step: one trainer step over a synthetic MLP (batch_norm after each hidden layer, so
// buffer sync has work), each policy varied from the defaults one at a time, at each world size;
// or (--model gpt, gpt-10m) over ddp::nn::gpt, each update strategy, bucket cap, hook and the
// invariant reduction against the defaults, with tokens/s.
// Per configuration:
//   - the step time: the best of --repeats alternating measurements, each the slowest rank's
//     mean over --steps steps;
//   - its parts, from runs with the step timeline recording (the least disturbed of --repeats):
//     compute = forward + backward, the buckets' reductions, the share of them that ran while
//     backward still computed, the wait for them, the update;
//   - the bytes each rank hands to collectives per step;
//   - the ratio to the same step without synchronisation: the step by hand, without ddp, on as
//     many threads at once, measured in the same run (what the machine allows that many ranks of
//     this model whatever ddp does; at world 1, what the trainer itself costs).
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <thread>

#include "ddp_bench/commands.hpp"
#include "ddp_bench/gpt_workload.hpp"
#include "ddp/core/random.hpp"
#include "ddp/ddp.hpp"
#include "ddp/host/kernels.hpp"
#include "ddp/inproc/launch.hpp"
#include "ddp/nn/batch_norm.hpp"
#include "ddp/nn/cross_entropy.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/relu.hpp"
#include "ddp/nn/sequential.hpp"
#include "ddp/host/linalg.hpp"
#include "ddp/policy/powersgd.hpp"
#include "ddp/sampler/virtual_shards.hpp"

namespace bench {
namespace step_detail {

using ddp::nn::batch_norm, ddp::nn::linear, ddp::nn::relu;
using model = ddp::nn::sequential<linear, batch_norm, relu, linear, batch_norm, relu, linear, batch_norm, relu, linear>;
constexpr std::size_t inputs = 512, classes = 16;

struct widths {
  std::size_t a, b, c;
};

widths widths_for(const std::string& profile, std::size_t h) {
  if (profile == "funnel") return {2 * h, h, std::max<std::size_t>(h / 2, 1)};
  if (profile == "wide") return {4 * h, h, h};
  return {h, h, h};
}

std::size_t parameter_count(const widths& w) {
  auto layer = [](std::size_t in, std::size_t out) { return in * out + out; };
  return layer(inputs, w.a) + layer(w.a, w.b) + layer(w.b, w.c) + layer(w.c, classes) + 2 * (w.a + w.b + w.c);
}

// The smallest base width whose model has at least `target` parameters.
widths solve(const std::string& profile, std::size_t target) {
  std::size_t lo = 1, hi = 1;
  while (parameter_count(widths_for(profile, hi)) < target) hi *= 2;
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    if (parameter_count(widths_for(profile, mid)) < target) lo = mid + 1;
    else hi = mid;
  }
  return widths_for(profile, lo);
}

model make_model(const widths& w) {
  return model(linear(inputs, w.a, 1), batch_norm(w.a), relu(), linear(w.a, w.b, 2), batch_norm(w.b), relu(),
               linear(w.b, w.c, 3), batch_norm(w.c), relu(), linear(w.c, classes, 4));
}

struct batch {
  ddp::nn::matrix x;
  std::vector<std::int32_t> y;
};
batch make_batch(std::size_t n, std::uint64_t seed) {
  ddp::splitmix64 rng(seed);
  batch b{ddp::nn::matrix(n, inputs), std::vector<std::int32_t>(n)};
  for (auto& v : b.x.data) v = rng.uniform(-1, 1);
  for (auto& y : b.y) y = static_cast<std::int32_t>(rng.below(classes));
  return b;
}

// What a measurement trains: the model, a batch of n samples from a seed, and the loss's gradient.
struct mlp_workload {
  using model_type = model;
  using batch_type = batch;
  widths w;
  model_type make() const { return make_model(w); }
  batch_type make_batch(std::size_t n, std::uint64_t seed) const { return step_detail::make_batch(n, seed); }
  static ddp::nn::matrix loss_gradient(const ddp::nn::matrix& out, const batch_type& b) {
    return ddp::nn::softmax_cross_entropy(out, b.y).grad;
  }
};
struct gpt_workload {  // a sample is a sequence of the model's context
  using model_type = ddp::nn::gpt;
  using batch_type = token_batch;
  ddp::nn::gpt_config config;
  model_type make() const { return model_type(config); }
  batch_type make_batch(std::size_t n, std::uint64_t seed) const { return make_token_batch(config, n, seed); }
  static ddp::nn::matrix loss_gradient(const ddp::nn::matrix& logits, const batch_type& b) {
    return ddp::nn::sequence_cross_entropy(logits, b.y).grad;
  }
};

const ddp::optim::sgd sgd{.lr = 0.01f, .momentum = 0.9f, .weight_decay = 0.0f};

// One measurement's figures, per step (medians over the timed steps for the parts).
struct figures {
  double step = 0, compute = 0, reduction = 0, overlapped = 0, wait = 0, update = 0;
  double bytes = 0;
  double memory = 0, memory_peak = 0;  // bytes for parameters, gradients and optimizer state: between steps, at most in one
};

// The parts of each step from rank 0's timeline.
void read_timeline(const ddp::timeline& t, figures& f) {
  std::map<std::uint64_t, std::map<std::string, double>> per_step;
  for (const auto& e : t.events()) {
    const double s = std::chrono::duration<double>(e.end - e.begin).count();
    std::string key = e.name;
    if (e.track == ddp::timeline_track::collectives) key = "reduction";
    per_step[e.step][key] += s;
  }
  std::vector<double> compute, reduction, wait, update;
  for (auto& [step, parts] : per_step) {
    if (!parts.count("step")) continue;
    compute.push_back(parts["forward"] + parts["backward"]);
    reduction.push_back(parts["reduction"]);
    wait.push_back(parts["wait for reductions"]);
    update.push_back(parts["update"]);
  }
  f.compute = median(compute), f.reduction = median(reduction), f.wait = median(wait), f.update = median(update);
}

// Bytes of gradients a rank hands to collectives per step under the hook.
template <class Hook, class Model>
double gradient_bytes(Model& m, double elements, const Hook& hook) {
  if constexpr (std::is_same_v<Hook, ddp::comm_hook::none>) {
    return 4.0 * elements;
  } else if constexpr (requires { hook.min_compression_rate; }) {
    std::vector<ddp::comm_hook::tensor_layout> tensors;
    for (auto&& p : m.parameters()) {
      const ddp::parameter_ref ref = p;
      const auto rows = static_cast<std::size_t>(ref.value.shape.at(0));
      tensors.push_back({0, rows, ref.value.numel() / rows});
    }
    const auto plan = ddp::comm_hook::detail::plan(tensors, Hook::rank, hook.min_compression_rate);
    return 4.0 * static_cast<double>(plan.p_floats + plan.q_floats + plan.plain_floats);
  } else {
    return 2.0 * elements;
  }
}

// With Shards > 0 a step is the global batch (batch x world) dealt as that many virtual shards,
// each its own micro-batch (sampler::virtual_shards): what reduction::invariant<Shards> runs.
// With `overlap` the optimizer updates each bucket as its reduction completes.
template <class Trainer, class Workload, std::size_t Shards = Trainer::reduction_policy::virtual_shards>
figures measure(int world, const Workload& w, const step_params& p, bool breakdown, bool overlap = false) {
  std::vector<figures> per_rank = ddp::inproc::launch(world, [&](ddp::inproc::communicator& comm) {
    auto m = w.make();
    ddp::host::device dev;
    Trainer t(m, comm, dev, sgd);
    t.overlap_optimizer(overlap);
    auto& hook = t.template policy<ddp::comm_hook::slot>();
    if constexpr (requires { hook.start_after = 0; }) hook.start_after = 0;  // powersgd: compressed from the first step
    using batch_type = typename Workload::batch_type;
    const auto b = w.make_batch(p.batch, 11 + static_cast<std::uint64_t>(comm.rank()));
    auto train_on = [](const batch_type& x) {
      return [&x](auto& r) { r.backward(Workload::loss_gradient(r.forward(x.x), x)); };
    };
    std::vector<batch_type> shards;  // this rank's virtual shards
    if constexpr (Shards > 0) {
      const auto mine = ddp::sampler::virtual_shards(Shards, comm.rank(), comm.size());
      const std::size_t shard_batch = std::max<std::size_t>(1, p.batch * static_cast<std::size_t>(world) / Shards);
      for (std::size_t s = mine.first; s < mine.last; ++s) shards.push_back(w.make_batch(shard_batch, 101 + s));
    }
    auto one = [&] {
      if (shards.empty()) return t.step(train_on(b));
      for (std::size_t s = 0; s + 1 < shards.size(); ++s) t.accumulate(train_on(shards[s]));
      t.step(train_on(shards.back()));
    };
    one(), one();  // warm-up
    ddp::timeline timeline;
    if (breakdown) t.record_timeline(&timeline);
    double overlapped = 0, reduced = 0;
    dev.reset_memory_high_water();
    ddp::comm::barrier(comm);
    const auto t0 = clock_type::now();
    for (int s = 0; s < p.steps; ++s) {
      one();
      overlapped += t.last_step_overlap().overlapped_seconds;
      reduced += t.last_step_overlap().reduction_seconds;
    }
    figures f;
    f.step = std::chrono::duration<double>(clock_type::now() - t0).count() / p.steps;
    f.memory = static_cast<double>(t.memory().total());
    f.memory_peak = f.memory + static_cast<double>(dev.memory_high_water() - dev.memory_in_use());
    ddp::comm::all_reduce(comm, std::span<double>(&f.step, 1), ddp::reduce_op::max);
    if (breakdown) read_timeline(timeline, f);
    f.overlapped = reduced > 0 ? overlapped / reduced : 0;
    // Bytes this rank hands to collectives per step: every bucket's gradients (and, sharded, the
    // gathered parameters), and the buffers when the policy moves them.
    // A compressing hook's gradients travel in 16 bits (its control floats, a few, in f32), or as
    // powersgd's factors and the tensors it leaves whole, in f32; the gathered parameters in f32.
    double elements = 0;
    for (const auto n : t.bucket_sizes()) elements += static_cast<double>(n);
    // Under an exact sum (reduction::invariant) they travel as 64-bit integers, after one float of
    // agreed maximum per 64 elements.
    const double grads =
        (Trainer::reduction_policy::virtual_shards ? 8.0 * elements + 4.0 * std::ceil(elements / 64.0)
                                                   : gradient_bytes<typename Trainer::comm_hook_policy>(m, elements, hook)) +
        (ddp::update::shards_parameters<typename Trainer::update_policy>() ? 8.0 * elements  // forward, backward
         : ddp::update::gathers_parameters<typename Trainer::update_policy>() ? 4.0 * elements
                                                                          : 0.0);
    double buffers = 0;
    for (const auto& buf : m.buffers()) buffers += static_cast<double>(buf.value.bytes());
    const bool moves_buffers = !std::is_same_v<typename Trainer::buffer_sync_policy, ddp::buffer_sync::none>;
    f.bytes = world > 1 ? grads + (moves_buffers ? buffers : 0) : 0;
    t.gather_parameters();  // update::fully_sharded: the model whole again before the trainer goes
    return f;
  });
  return per_rank[0];
}

// The same step by hand (forward, loss, backward, SGD with momentum, zero the gradients), as a
// single-process loop without ddp does it.
template <class Workload>
class step_by_hand {
 public:
  using model_type = typename Workload::model_type;
  explicit step_by_hand(model_type& m) : m_(m) {
    for (auto& p : m_.parameters()) {
      params_.push_back(p);
      momentum_.emplace_back(p.value.numel(), 0.0f);
    }
  }
  void operator()(const typename Workload::batch_type& b) {
    m_.backward(Workload::loss_gradient(m_.forward(b.x), b), {});
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto v = params_[i].value.as<float>();
      auto g = params_[i].grad.as<float>();
      ddp::host::rule_segment(v.data(), g.data(), momentum_[i].data(), v.size(), sgd.at(1));
      std::fill(g.begin(), g.end(), 0.0f);
    }
  }

 private:
  model_type& m_;
  std::vector<ddp::parameter_ref> params_;
  std::vector<std::vector<float>> momentum_;
};

// That step on `world` threads at once, each on its own replica: no synchronisation and no ddp.
template <class Workload>
figures measure_unsynchronised(int world, const Workload& w, const step_params& p) {
  std::barrier start(world);
  std::vector<double> seconds(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int i = 0; i < world; ++i)
    threads.emplace_back([&, i] {
      auto m = w.make();
      step_by_hand<Workload> one(m);
      const auto b = w.make_batch(p.batch, 11 + static_cast<std::uint64_t>(i));
      one(b), one(b);
      start.arrive_and_wait();
      const auto t0 = clock_type::now();
      for (int s = 0; s < p.steps; ++s) one(b);
      seconds[static_cast<std::size_t>(i)] = std::chrono::duration<double>(clock_type::now() - t0).count() / p.steps;
    });
  for (auto& t : threads) t.join();
  return {.step = *std::ranges::max_element(seconds)};
}

template <class Workload>
struct configuration {
  std::string slot, policy;
  std::function<figures(int, const Workload&, const step_params&, bool)> run;
};

template <class Workload, class... Policies>
configuration<Workload> config(std::string slot, std::string policy) {
  return {std::move(slot), std::move(policy), [](int world, const Workload& w, const step_params& p, bool breakdown) {
            return measure<ddp::trainer<typename Workload::model_type, Policies...>>(world, w, p, breakdown);
          }};
}
template <class Workload, class... Policies>
configuration<Workload> overlapped(std::string slot, std::string policy) {
  return {std::move(slot), std::move(policy), [](int world, const Workload& w, const step_params& p, bool breakdown) {
            return measure<ddp::trainer<typename Workload::model_type, Policies...>>(world, w, p, breakdown,
                                                                                    /*overlap=*/true);
          }};
}
// The plain reduction over the same micro-batches as reduction::invariant<Shards>: what the
// exact sum costs beyond cutting the batch into shards.
template <class Workload, std::size_t Shards>
configuration<Workload> plain_in_shards(std::string slot, std::string policy) {
  return {std::move(slot), std::move(policy), [](int world, const Workload& w, const step_params& p, bool breakdown) {
            return measure<ddp::trainer<typename Workload::model_type>, Workload, Shards>(world, w, p, breakdown);
          }};
}

std::vector<configuration<mlp_workload>> configurations(const std::vector<std::string>& vary) {
  using W = mlp_workload;
  auto varies = [&](const char* slot) { return std::ranges::find(vary, slot) != vary.end(); };
  std::vector<configuration<mlp_workload>> c{config<W>("defaults", "(all six)")};
  if (varies("bucket_cap")) {
    c.push_back(config<W, ddp::bucket_cap<std::size_t{256} << 10>>("bucket_cap", "256 KiB"));
    c.push_back(config<W, ddp::bucket_cap<std::size_t{1} << 20>>("bucket_cap", "1 MiB"));
    c.push_back(config<W, ddp::bucket_cap<std::size_t{4} << 20>>("bucket_cap", "4 MiB"));
  }
  if (varies("buffer_sync")) {
    c.push_back(config<W, ddp::buffer_sync::none>("buffer_sync", "none"));
    c.push_back(config<W, ddp::buffer_sync::broadcast_each_forward>("buffer_sync", "broadcast_each_forward"));
    c.push_back(config<W, ddp::buffer_sync::average_once_per_step>("buffer_sync", "average_once_per_step"));
  }
  if (varies("unused_params")) {
    c.push_back(config<W, ddp::unused_params::detect_each_step>("unused_params", "detect_each_step"));
    c.push_back(config<W, ddp::unused_params::static_graph>("unused_params", "static_graph"));
  }
  if (varies("update")) {
    c.push_back(config<W, ddp::update::sharded>("update", "sharded"));
    c.push_back(config<W, ddp::update::sharded_gradients>("update", "sharded_gradients"));
    // Its peak drops below sharded's once buckets are small against the model.
    c.push_back(config<W, ddp::update::sharded, ddp::bucket_cap<std::size_t{512} << 10>>("update", "sharded, 512 KiB"));
    c.push_back(config<W, ddp::update::sharded_gradients, ddp::bucket_cap<std::size_t{512} << 10>>(
        "update", "sharded_gradients, 512 KiB"));
    // The parameters sharded too, gathered layer by layer (a bucket per layer or two at 512 KiB).
    c.push_back(config<W, ddp::update::fully_sharded>("update", "fully_sharded"));
    c.push_back(config<W, ddp::update::fully_sharded, ddp::bucket_cap<std::size_t{512} << 10>>(
        "update", "fully_sharded, 512 KiB"));
    // The optimizer overlapped with the reductions (trainer.overlap_optimizer), with the default
    // buckets and with buckets small enough that the last reduces while the first are updated
    // (against bucket_cap's "1 MiB" row).
    c.push_back(overlapped<W>("update", "replicated, overlapped"));
    c.push_back(overlapped<W, ddp::bucket_cap<std::size_t{1} << 20>>("update", "replicated, 1 MiB, overlapped"));
  }
  if (varies("comm_hook")) {
    c.push_back(config<W, ddp::comm_hook::bf16>("comm_hook", "bf16"));
    c.push_back(config<W, ddp::comm_hook::fp16>("comm_hook", "fp16"));
    c.push_back(config<W, ddp::comm_hook::powersgd<4>>("comm_hook", "powersgd<4>"));
  }
  if (varies("reduction")) {
    c.push_back(plain_in_shards<W, 8>("reduction", "plain, 8 shards"));
    c.push_back(config<W, ddp::reduction::invariant<8>>("reduction", "invariant<8>"));
  }
  return c;
}


// The GPT's rows: each update strategy, bucket caps of 1 and 25 MiB with the optimizer overlapped
// and not, the hooks, and reduction::invariant<2> (a shard is half the global batch: at least 32
// sequences with --batch 32 at 2 ranks) beside the plain reduction over the same two micro-batches.
// The model has no buffers and uses every parameter: buffer_sync and unused_params are not varied.
// Fewer trainer types than the MLP's rows, to keep ddp-bench's build short.
std::vector<configuration<gpt_workload>> gpt_configurations(const std::vector<std::string>& vary) {
  using W = gpt_workload;
  using one_mib = ddp::bucket_cap<std::size_t{1} << 20>;
  auto varies = [&](const char* slot) { return std::ranges::find(vary, slot) != vary.end(); };
  std::vector<configuration<W>> c{config<W>("defaults", "replicated, 25 MiB")};
  if (varies("bucket_cap")) c.push_back(config<W, one_mib>("bucket_cap", "1 MiB"));
  if (varies("update")) {
    c.push_back(overlapped<W>("update", "replicated, overlapped"));
    c.push_back(overlapped<W, one_mib>("update", "replicated, 1 MiB, overlapped"));
    c.push_back(config<W, ddp::update::sharded>("update", "sharded"));
    c.push_back(config<W, ddp::update::sharded_gradients>("update", "sharded_gradients"));
    c.push_back(config<W, ddp::update::fully_sharded>("update", "fully_sharded"));
  }
  if (varies("comm_hook")) {
    c.push_back(config<W, ddp::comm_hook::bf16>("comm_hook", "bf16"));
    c.push_back(config<W, ddp::comm_hook::fp16>("comm_hook", "fp16"));
    c.push_back(config<W, ddp::comm_hook::powersgd<4>>("comm_hook", "powersgd<4>"));
  }
  if (varies("reduction")) {
    c.push_back(plain_in_shards<W, 2>("reduction", "plain, 2 shards"));
    c.push_back(config<W, ddp::reduction::invariant<2>>("reduction", "invariant<2>"));
  }
  return c;
}

// Every configuration at each world size of --ranks, alternated; the rows and notes into `out`.
// `tokens` (the GPT's tokens per sequence, 0 for the MLP) adds tokens/s and each row's rate
// against the defaults'.
template <class Workload>
void measure_rows(const step_params& p, const Workload& w, const std::vector<configuration<Workload>>& configs,
                  std::size_t tokens, report& out) {
  for (const int world : p.ranks) {
    if (world < 1) throw std::invalid_argument("--ranks takes world sizes of 1 or more");
    // Alternate every configuration and the unsynchronised step, so drifts of a shared machine
    // hit them alike; keep each one's best.
    std::vector<double> best(configs.size(), 1e300);
    std::vector<figures> parts(configs.size(), figures{.step = 1e300});  // with the timeline recording
    double unsynchronised = 1e300;
    measure_unsynchronised(world, w, p);  // warm-up: page in, grow the heaps
    for (const auto& c : configs) c.run(world, w, p, false);
    for (int r = 0; r < p.repeats; ++r) {
      unsynchronised = std::min(unsynchronised, measure_unsynchronised(world, w, p).step);
      for (std::size_t i = 0; i < configs.size(); ++i) {
        best[i] = std::min(best[i], configs[i].run(world, w, p, false).step);
        const auto f = configs[i].run(world, w, p, true);
        if (f.step < parts[i].step) parts[i] = f;  // the least disturbed run's parts
      }
    }
    const double tokens_per_step = static_cast<double>(tokens * p.batch) * world;
    for (std::size_t i = 0; i < configs.size(); ++i) {
      const auto& f = parts[i];
      std::vector<cell> row{static_cast<long long>(world), configs[i].slot, configs[i].policy, best[i] * 1e3,
                                    f.compute * 1e3, f.reduction * 1e3, f.overlapped, f.wait * 1e3, f.update * 1e3,
                                    static_cast<long long>(f.bytes), f.memory / (1 << 20), f.memory_peak / (1 << 20),
                                    best[i] / unsynchronised};
      if (tokens) row.insert(row.begin() + 4, {tokens_per_step / best[i], best[0] / best[i]});
      out.add(row);
    }
    std::vector<cell> row{static_cast<long long>(world), std::string("no sync"),
                                  std::string(std::to_string(world) + " x by hand"), unsynchronised * 1e3,
                                  std::string("-"), std::string("-"), std::string("-"), std::string("-"),
                                  std::string("-"), 0LL, std::string("-"), std::string("-"), 1.0};
    if (tokens) row.insert(row.begin() + 4, {tokens_per_step / unsynchronised, best[0] / unsynchronised});
    out.add(row);
    char line[200];
    std::snprintf(line, sizeof line, "world %d: the timeline recording costs %+.1f%% of the default step (%.3f against %.3f ms)",
                  world, 100 * (parts[0].step / best[0] - 1), parts[0].step * 1e3, best[0] * 1e3);
    out.note(line);
  }
}

}  // namespace step_detail

int run_step(const step_params& p) {
  using namespace step_detail;
  std::vector<column> columns{{"ranks", 5, 0}, {"slot", 13, 0}, {"policy", 22, 0}, {"step(ms)", 9, 3},
                                      {"compute(ms)", 11, 3}, {"reduce(ms)", 10, 3}, {"overlap", 7, 2},
                                      {"wait(ms)", 9, 3}, {"update(ms)", 10, 3}, {"bytes/step", 11, 0},
                                      {"memory(MiB)", 11, 2}, {"peak(MiB)", 9, 2}, {"vs_no_sync", 10, 3}};
  const std::string timing = "; best of " + std::to_string(p.repeats) + " x " + std::to_string(p.steps) + " steps";
  const std::string legend =
      "compute = forward + backward; reduce = the buckets' collectives (they overlap compute); overlap = the "
      "share of them that ran while backward computed; vs_no_sync = step / the same step by hand "
      "(no ddp: forward, loss, backward, SGD with momentum) on as many threads at once, each on its own replica";
  if (is_gpt_model(p.model)) {
    const gpt_workload w{gpt_shape(p.model)};
    columns.insert(columns.begin() + 4, {{"tokens/s", 9, 0}, {"vs_defaults", 11, 3}});
    report out("step",
               describe_gpt(w.config, w.make().parameter_count()) + ", batch " + std::to_string(p.batch) +
                   " sequences of " + std::to_string(w.config.context) + " tokens per rank, SGD momentum" + timing,
               columns);
    out.begin(true);
    measure_rows(p, w, gpt_configurations(p.vary), w.config.context, out);
    out.note("defaults: bucket_cap 25 MiB, update replicated, comm_hook none, reduction plain; reduction's rows deal "
             "the global batch (batch x ranks) as 2 virtual shards, one micro-batch each; vs_defaults = the "
             "defaults' step / this step (tokens/s against the defaults'); " + legend);
    out.write(p.out);
    return 0;
  }
  const auto widths = solve(p.profile, p.params);
  const auto count = parameter_count(widths);
  report out("step",
             "MLP " + std::to_string(inputs) + "-" + std::to_string(widths.a) + "-" + std::to_string(widths.b) + "-" +
                 std::to_string(widths.c) + "-" + std::to_string(classes) + " with batch_norm (" +
                 std::to_string(count) + " parameters), batch " + std::to_string(p.batch) +
                 " per rank, SGD momentum" + timing,
             columns);
  out.begin(true);
  measure_rows(p, mlp_workload{widths}, configurations(p.vary), 0, out);
  out.note("defaults: bucket_cap 25 MiB, buffer_sync broadcast_once_per_step, unused_params forbid, update replicated, "
           "comm_hook none, reduction plain; reduction's rows deal the global batch (batch x ranks) as 8 virtual "
           "shards, one micro-batch each; " + legend);
  out.write(p.out);
  return 0;
}

}  // namespace bench
