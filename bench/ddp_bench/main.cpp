// ddp-bench: micro-benchmarks of ddp in one tool.
//   ddp-bench collective all_reduce --backend inproc|mpi|nccl -b 8 -e 64M -f 2 [-d float] [-o sum] [--out r.json]
//   ddp-bench collective all_reduce --check bits --ranks 1,2,3 [--reduction invariant|plain]
//   ddp-bench step --ranks 1,2 --params 1.3M [--vary bucket_cap,buffer_sync,unused_params,update,comm_hook,reduction]
//   ddp-bench step --model gpt|gpt-10m --ranks 1,2 --batch 32
//   ddp-bench scaling --ranks 2 [--rounds 15 --steps 120] [--model gpt|gpt-10m]
//   ddp-bench versions
// Every subcommand prints a table and, with --out FILE (.json or .csv), writes it with the
// command line, the date, the machine and the library version. docs/benchmarking.md has the rest.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <stdexcept>

#include "ddp_bench/commands.hpp"

namespace {

// "64M", "256K", "1G" or a plain count, as nccl-tests reads -b and -e.
std::size_t parse_size(const std::string& text) {
  std::size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (const std::logic_error&) {  // not a number, or out of double's range
    pos = 0;
  }
  if (pos == 0 || !(v >= 0))
    throw CLI::ValidationError("size", "'" + text + "': use a count of at least 0 with K, M or G, as 64M");
  const std::string unit = text.substr(pos);
  double scale = 1;
  if (unit == "K" || unit == "k") scale = 1024;
  else if (unit == "M" || unit == "m") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "g") scale = 1024.0 * 1024 * 1024;
  else if (!unit.empty()) throw CLI::ValidationError("size", "'" + text + "': use a count with K, M or G, as 64M");
  return static_cast<std::size_t>(v * scale);
}

void add_size(CLI::App* app, const std::string& flag, std::size_t& value, const std::string& help) {
  app->add_option_function<std::string>(flag, [&value](const std::string& s) { value = parse_size(s); }, help)
      ->default_str(std::to_string(value));
}

}  // namespace

int main(int argc, char** argv) {
  bench::set_command_line(argc, argv);
  CLI::App app{"ddp-bench: collectives over every backend, trainer steps over every policy, and scaling, in one tool"};
  app.require_subcommand(1);

  bench::collective_params c;
  auto* col = app.add_subcommand("collective", "an nccl-tests-style sweep of one collective, with a baseline beside it");
  col->add_option("collective", c.collective, "all_reduce, reduce_scatter, all_gather or broadcast")
      ->check(CLI::IsMember({"all_reduce", "reduce_scatter", "all_gather", "broadcast"}))->capture_default_str();
  col->add_option("--backend", c.backend, "inproc (threads), mpi (under mpirun) or nccl (GPU build)")
      ->check(CLI::IsMember({"inproc", "mpi", "nccl"}))->capture_default_str();
  std::vector<int> col_ranks{c.ranks};
  auto* col_ranks_option = col->add_option("--ranks,-g", col_ranks, "in-process ranks (inproc) or GPUs (nccl); mpirun "
                                           "-np sets MPI's; with --check bits a list of world sizes (default 1,2,3,4)")
      ->delimiter(',')->check(CLI::Range(1, 256))->capture_default_str();
  add_size(col, "-b,--minbytes", c.min_bytes, "smallest size in bytes (K, M, G allowed)");
  add_size(col, "-e,--maxbytes", c.max_bytes, "largest size in bytes");
  col->add_option("-f,--stepfactor", c.step_factor, "multiply the size by this between steps")->capture_default_str();
  add_size(col, "-i,--stepbytes", c.step_bytes, "add this many bytes between steps (when -f is 1)");
  col->add_option("-n,--iters", c.iters, "timed iterations per batch")->check(CLI::Range(1, 1000000))->capture_default_str();
  col->add_option("-w,--warmup_iters", c.warmup, "untimed iterations first")->check(CLI::Range(0, 1000000))->capture_default_str();
  std::string col_check = "1";
  col->add_option("-c,--check", col_check, "1: check every result element, a wrong one fails the run (exit status 1); "
                                           "0: no (#wrong reads n/a); bits: reduce seeded inputs over every backend "
                                           "and world size of --ranks and compare the results' bits")
      ->check(CLI::IsMember({"0", "1", "bits"}))->capture_default_str();
  col->add_option("--reduction", c.reduction, "--check bits: invariant (exact sums: the same bits at every world "
                                              "size) or plain (a floating-point sum, whose bits may differ)")
      ->check(CLI::IsMember({"invariant", "plain"}))->capture_default_str();
  col->add_option("--shards", c.shards, "--check bits: the seeded inputs are this many virtual shards, dealt over "
                                        "the ranks")->check(CLI::Range(1, 4096))->capture_default_str();
  col->add_option("--seed", c.seed, "--check bits: the seed of the inputs")->capture_default_str();
  col->add_option("-z,--blocking", c.blocking, "1: each call waited for before the next (every call timed: the "
                                               "p50..max columns); 0: a batch of -n calls issued back to back, then "
                                               "waited for once (nccl-tests' default)")
      ->check(CLI::IsMember({0, 1}))->capture_default_str();
  if (bench::has_cuda_graphs())
    col->add_option("-G,--cuda-graph,--cudagraph", c.cuda_graph,
                    "--backend nccl: capture a batch of -n calls into a CUDA graph and launch it this many times "
                    "(0: no graph)")
        ->check(CLI::Range(0, 100000))->capture_default_str();
  col->add_option("-N,--cycles,--run_cycles", c.cycles, "run the whole sweep this many times (the cycle column)")
      ->check(CLI::Range(1, 100000))->capture_default_str();
  col->add_option("-T,--timeout", c.timeout, "seconds one size may take (0: no limit); a size past it stops the "
                                             "sweep on every rank and fails the run")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  int col_memory = 0;
  col->add_option("-M,--memory_report", col_memory, "1: per size the host RSS high-water mark and the device memory "
                                                    "in use (GPU build)")
      ->check(CLI::IsMember({0, 1}))->capture_default_str();
  col->add_flag("--overlap", c.overlap, "per size the share of a compute period the asynchronous form hides (OSU's "
                                        "overlap): four more columns");
  col->add_flag("--inject-wrong", c.inject_wrong, "tests: alter one element of each checked result on rank 0, so "
                                                  "that the run must fail");
  col->add_option("--repeats", c.repeats, "batches of -n iterations; the best is reported")->check(CLI::Range(1, 1000))->capture_default_str();
  col->add_option("-a,--average", c.average, "time across ranks: 0 rank 0, 1 mean, 2 min, 3 max")->check(CLI::Range(0, 3))->capture_default_str();
  col->add_option("-d,--datatype", c.dtypes, "float, double, int32, int64, uint8 or all")->delimiter(',')->capture_default_str();
  col->add_option("-o,--op", c.ops, "sum, avg, min, max or all")->delimiter(',')->capture_default_str();
  col->add_option("-r,--root", c.root, "broadcast's root")->capture_default_str();
  col->add_option("--bind", c.bind, "inproc: bind rank r's thread to the r-th CPU, as mpirun binds processes (0 or 1)")
      ->capture_default_str();
  col->add_option("--out", c.out, "also write the table to this .json or .csv file");

  bench::step_params s;
  auto* step = app.add_subcommand("step", "a trainer step over a synthetic MLP or a GPT, one policy varied at a time, "
                                          "against the same step without synchronisation");
  step->add_option("--model", s.model, "mlp (synthetic, --params), gpt (the char_gpt example's: 4 layers, width 128, "
                   "context 64) or gpt-10m (6 layers, width 384, context 256)")
      ->check(CLI::IsMember({"mlp", "gpt", "gpt-10m"}))->capture_default_str();
  step->add_option("--ranks", s.ranks, "world sizes (in-process ranks)")->delimiter(',')->capture_default_str();
  step->add_option_function<std::string>("--params", [&s](const std::string& v) { s.params = parse_size(v); },
                                         "parameters of the synthetic model (K, M allowed)")->default_str("1.3M");
  step->add_option("--profile", s.profile, "hidden widths: flat (h, h, h), funnel (2h, h, h/2), wide (4h, h, h)")
      ->check(CLI::IsMember({"flat", "funnel", "wide"}))->capture_default_str();
  step->add_option("--batch", s.batch, "batch per rank (sequences for a GPT)")->check(CLI::Range(1, 100000))->capture_default_str();
  step->add_option("--steps", s.steps, "timed steps per measurement")->check(CLI::Range(1, 100000))->capture_default_str();
  step->add_option("--repeats", s.repeats, "alternating measurements of each configuration; the best is kept")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  step->add_option("--vary", s.vary, "the policies varied from the defaults, one at a time")
      ->delimiter(',')->check(CLI::IsMember({"bucket_cap", "buffer_sync", "unused_params", "update", "comm_hook", "reduction", "none"}))
      ->capture_default_str();
  step->add_option("--out", s.out, "also write the table to this .json or .csv file");

  bench::scaling_params sc;
  auto* scaling = app.add_subcommand("scaling", "the example's model: 1 rank, N ranks (replicated and sharded) and N "
                                                "independent ranks, interleaved in rounds");
  scaling->add_option("--model", sc.model, "mlp (the Fashion-MNIST example's), gpt (the char_gpt example's) or "
                      "gpt-10m (6 layers, width 384, context 256); a GPT trains on synthetic tokens")
      ->check(CLI::IsMember({"mlp", "gpt", "gpt-10m"}))->capture_default_str();
  scaling->add_option("--ranks", sc.ranks, "ranks of the data-parallel set-up")->check(CLI::Range(2, 64))->capture_default_str();
  scaling->add_option("--rounds", sc.rounds, "rounds; each runs every set-up once, in rotating order")
      ->check(CLI::Range(1, 10000))->capture_default_str();
  scaling->add_option("--steps", sc.steps, "training steps per rank in each set-up of a round")
      ->check(CLI::Range(1, 100000))->capture_default_str();
  scaling->add_option("--batch", sc.batch, "batch per rank (sequences for a GPT)")->check(CLI::Range(2, 60000))->capture_default_str();
  scaling->add_option("--optimizer", sc.optimizer, "sgd (momentum 0.9) or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}))->capture_default_str();
  scaling->add_option("--hooks", sc.hooks, "also N ranks with these communication hooks (bf16, fp16, powersgd: rank 4)")
      ->delimiter(',')->check(CLI::IsMember({"bf16", "fp16", "powersgd"}));
  scaling->add_option("--data-dir", sc.data_dir, "directory with the Fashion-MNIST .gz files (default: Debian's)");
  scaling->add_option("--out", sc.out, "also write the table to this .json or .csv file");

  bench::invariance_params iv;
  auto* invariance = app.add_subcommand("invariance", "the example's model trained K steps under "
                                                      "reduction::invariant<8> at every world size of a list: one hash "
                                                      "of parameters and buffers per run, exit 1 unless they agree");
  invariance->add_option("--ranks", iv.ranks, "world sizes (in-process ranks, 1 to 8)")->delimiter(',')->capture_default_str();
  invariance->add_option("--backend", iv.backend, "inproc, or mpi: the world mpirun started")
      ->check(CLI::IsMember({"inproc", "mpi"}))->capture_default_str();
  invariance->add_option("--update", iv.updates, "update policies")->delimiter(',')
      ->check(CLI::IsMember({"replicated", "sharded"}))->capture_default_str();
  invariance->add_option("--optimizer", iv.optimizers, "optimizers (sgd: momentum 0.9; adamw)")->delimiter(',')
      ->check(CLI::IsMember({"sgd", "adamw"}))->capture_default_str();
  invariance->add_option("--reduction", iv.reduction, "invariant, or plain: the same shards under the plain "
                                                      "reduction, whose hashes differ")
      ->check(CLI::IsMember({"invariant", "plain"}))->capture_default_str();
  invariance->add_option("--steps", iv.steps, "training steps")->check(CLI::Range(1, 100000))->capture_default_str();
  invariance->add_option("--global-batch", iv.global_batch, "samples per step, a multiple of 8")
      ->check(CLI::Range(16, 60000))->capture_default_str();
  invariance->add_option("--hidden", iv.hidden, "hidden width of the example's model")
      ->check(CLI::Range(8, 4096))->capture_default_str();
  invariance->add_option("--expect", iv.expect, "the hash every run must give (e.g. an in-process run's)");
  invariance->add_option("--lose", iv.lose, "RANK@STEP: that rank throws in that step, the others go on "
                                            "(launch_elastic); the hash must not change");
  invariance->add_option("--rejoin", iv.rejoin, "with --lose: a rank joins again that many steps after the loss "
                                                "(elastic_control::grow); the hash must not change")
      ->check(CLI::Range(1, 1000000));
  invariance->add_option("--data-dir", iv.data_dir, "directory with the Fashion-MNIST .gz files (default: Debian's)");
  invariance->add_option("--out", iv.out, "also write the table to this .json or .csv file");

  auto* versions = app.add_subcommand("versions", "ddp's version; in the GPU build also the CUDA driver, CUDA "
                                                  "runtime and NCCL versions it finds and the libraries it loaded "
                                                  "(no GPU needed; exit 1 when NCCL is older than the build needs "
                                                  "or the runtime newer than the driver)");

  CLI11_PARSE(app, argc, argv);
  try {
    if (versions->parsed()) {
      std::printf("ddp %s\n", bench::library_version());
      const auto v = bench::find_gpu_versions();
      if (v.cuda_runtime.empty()) return 0;
      std::printf("CUDA driver %s, CUDA runtime %s, NCCL %s\n", v.driver.c_str(), v.cuda_runtime.c_str(), v.nccl.c_str());
      std::printf("NCCL needed: %s or newer (built against nccl.h %s)\n", v.nccl_needed.c_str(), v.nccl_built.c_str());
      std::printf("CUDA devices: %s\n", v.devices.c_str());
      for (const auto& path : v.loaded) std::printf("loaded: %s\n", path.c_str());
      std::fflush(stdout);
      for (const auto& problem : v.problems) std::fprintf(stderr, "ddp-bench-gpu: FAILED: %s\n", problem.c_str());
      return v.problems.empty() ? 0 : 1;
    }
    if (col->parsed()) {
      c.check_bits = col_check == "bits";
      c.check = col_check == "0" ? 0 : 1;
      c.memory = col_memory != 0;
      if (c.check_bits) {
        c.rank_list = col_ranks_option->count() ? col_ranks : std::vector<int>{1, 2, 3, 4};
        if (!col->get_option("-e")->count()) c.max_bytes = std::size_t{1} << 20;
        return bench::run_check_bits(c);
      }
      if (col_ranks.size() != 1)
        throw std::invalid_argument("--ranks takes one count for a sweep; a list of world sizes goes with --check bits");
      c.ranks = col_ranks.front();
      return bench::run_collective(c);
    }
#if DDP_BENCH_WITH_TRAINER
    if (step->parsed()) return bench::run_step(s);
    if (invariance->parsed()) return bench::run_invariance(iv);
    return bench::run_scaling(sc);
#else
    throw std::invalid_argument("step and scaling need ddp::nn and ddp::data (OpenBLAS, zlib), which this build lacks");
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp-bench: %s\n", e.what());
    return 1;
  }
}
