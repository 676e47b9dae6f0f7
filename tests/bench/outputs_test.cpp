// ddp-bench's output files, written by the ctest entries bench_* (each subcommand run briefly at
// its smallest sizes): each parses, says what produced it, has rows, every check column reads
// zero wrong elements, and the columns and modes beside nccl-tests' read as documented.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

std::filesystem::path outputs() {
  const char* dir = std::getenv("DDP_BENCH_OUTPUTS");
  REQUIRE_MESSAGE(dir != nullptr, "DDP_BENCH_OUTPUTS names the directory the bench_* entries wrote to");
  return dir;
}

nlohmann::json read_json(const std::string& name) {
  const auto path = outputs() / name;
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "ddp-bench did not write ", path.string());
  return nlohmann::json::parse(in);
}

void check_common(const nlohmann::json& j, const std::string& subcommand) {
  CHECK(j.at("tool") == "ddp-bench");
  CHECK(j.at("subcommand") == subcommand);
  CHECK(j.at("command").get<std::string>().find(subcommand) != std::string::npos);
  CHECK(j.at("date").get<std::string>().size() == 20);  // 2026-12-01T22:29:31Z
  CHECK(!j.at("machine").at("cpu").get<std::string>().empty());
  CHECK(j.at("machine").at("cores").get<int>() >= 1);
  CHECK(!j.at("library_version").get<std::string>().empty());
  REQUIRE(!j.at("rows").empty());
  for (const auto& row : j.at("rows"))
    for (const auto& column : j.at("columns")) CHECK(row.contains(column.get<std::string>()));
}

void check_collective(const std::string& name, const std::string& collective, int ranks) {
  CAPTURE(name);
  const auto j = read_json(name);
  check_common(j, "collective");
  CHECK(j.at("title").get<std::string>().find(collective) == 0);
  CHECK(j.at("title").get<std::string>().find(std::to_string(ranks) + " rank(s)") != std::string::npos);
  for (const auto& row : j.at("rows")) {
    CAPTURE(row.dump());
    CHECK(row.at("ip_#wrong") == 0);
    if (collective == "broadcast") CHECK(row.at("oop_#wrong") == "n/a");
    else CHECK(row.at("oop_#wrong") == 0);
    CHECK(row.at("ip_time(us)").get<double>() > 0);
    CHECK(row.at("base_time(us)").get<double>() > 0);
    CHECK(row.at("async_time(us)").get<double>() > 0);
    CHECK(row.at("async/base").get<double>() > 0);
    CHECK(row.at("size(B)").get<long long>() > 0);
  }
}

}  // namespace

TEST_CASE("ddp-bench collective: every collective, every dtype and reduction, in-process at 3 ranks, no wrong element") {
  for (const std::string c : {"all_reduce", "reduce_scatter", "all_gather", "broadcast"})
    check_collective("collective_" + c + "_inproc.json", c, 3);
  // The machine's ceiling beside the memcpy baseline: three threads copying at once.
  const auto notes = read_json("collective_all_reduce_inproc.json").at("notes");
  REQUIRE(notes.size() == 4);  // the baseline, the forms, -z 1's tail columns, the ceiling
  CHECK(notes.at(2).get<std::string>().starts_with("-z 1: each call waited for"));
  CHECK(notes.at(3).get<std::string>().find("ceiling: 3 threads each copying") == 0);
  CHECK(notes.at(3).get<std::string>().find("tops out near 1.33 / ") != std::string::npos);
}

TEST_CASE("ddp-bench collective over MPI at 2 ranks, with raw MPI as the baseline") {
  check_collective("collective_all_reduce_mpi.json", "all_reduce", 2);
  const auto j = read_json("collective_all_reduce_mpi.json");
  CHECK(j.at("notes").at(0).get<std::string>().find("raw MPI") != std::string::npos);
  CHECK(j.at("notes").at(1).get<std::string>().find("blocking form") != std::string::npos);
}

TEST_CASE("ddp-bench collective: the tail of single calls, -N cycles, --overlap and -M, after nccl-tests' columns") {
  const auto j = read_json("collective_modes.json");
  check_common(j, "collective");
  const auto columns = j.at("columns").get<std::vector<std::string>>();
  const std::vector<std::string> added{"p50(us)", "p90(us)", "p99(us)", "max(us)", "cycle", "ovl_comm(us)",
                                       "ovl_compute(us)", "ovl_total(us)", "overlap(%)", "host_hwm(MiB)",
                                       "dev_used(MiB)"};
  REQUIRE(columns.size() == 18 + added.size());
  CHECK(columns.front() == "size(B)");
  CHECK(std::vector<std::string>(columns.begin() + 18, columns.end()) == added);
  std::map<long long, int> per_cycle;
  for (const auto& row : j.at("rows")) {
    CAPTURE(row.dump());
    CHECK(row.at("oop_#wrong") == 0);
    const double p50 = row.at("p50(us)"), p90 = row.at("p90(us)"), p99 = row.at("p99(us)"), max = row.at("max(us)");
    CHECK(p50 > 0);
    CHECK(p50 <= p90);
    CHECK(p90 <= p99);
    CHECK(p99 <= max);
    // The mean of the best batch is never above the slowest single call.
    CHECK(row.at("oop_time(us)").get<double>() <= max);
    ++per_cycle[row.at("cycle").get<long long>()];
    CHECK(row.at("ovl_comm(us)") == row.at("async_time(us)"));
    CHECK(row.at("ovl_compute(us)").get<double>() > 0);
    CHECK(row.at("ovl_total(us)").get<double>() > 0);
    CHECK(row.at("overlap(%)").get<double>() >= 0);
    CHECK(row.at("overlap(%)").get<double>() <= 100);
    CHECK(row.at("host_hwm(MiB)").get<double>() > 1);
    CHECK(row.at("dev_used(MiB)") == "n/a");
  }
  CHECK(per_cycle == std::map<long long, int>{{1, 3}, {2, 3}});
  CHECK(j.at("title").get<std::string>().find("(2 cycles)") != std::string::npos);
}

TEST_CASE("ddp-bench collective -z 0: a batch waited for once, so no single call's time") {
  const auto j = read_json("collective_nonblocking.json");
  check_common(j, "collective");
  for (const auto& row : j.at("rows")) {
    CAPTURE(row.dump());
    CHECK(row.at("oop_#wrong") == 0);
    CHECK(row.at("oop_time(us)").get<double>() > 0);
    CHECK(row.at("async_time(us)").get<double>() > 0);
    for (const char* tail : {"p50(us)", "p90(us)", "p99(us)", "max(us)"}) CHECK(row.at(tail) == "n/a");
  }
  bool said = false;
  for (const auto& note : j.at("notes")) said = said || note.get<std::string>().starts_with("-z 0: ");
  CHECK(said);
}

// --check bits: one row per backend and world size (`runs`, in order), every one the same hash
// under the invariant reduction.
void check_bits(const std::string& name, const std::vector<std::pair<std::string, int>>& runs) {
  CAPTURE(name);
  const auto j = read_json(name);
  check_common(j, "collective");
  CHECK(j.at("title").get<std::string>().starts_with("check bits: "));
  const auto& rows = j.at("rows");
  REQUIRE(rows.size() == runs.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    CAPTURE(rows[i].dump());
    CHECK(rows[i].at("backend") == runs[i].first);
    CHECK(rows[i].at("ranks") == runs[i].second);
    CHECK(rows[i].at("reduction") == "invariant");
    CHECK(rows[i].at("elements") == 4096);
    CHECK(rows[i].at("hash").get<std::string>().size() == 16);
    CHECK(rows[i].at("hash") == rows[0].at("hash"));
    CHECK(rows[i].at("ranks_agree") == "yes");
    CHECK(rows[i].at("same") == "yes");
  }
  CHECK(j.at("notes").back().get<std::string>().starts_with("bits: identical: all " + std::to_string(runs.size())));
}

TEST_CASE("ddp-bench collective --check bits: reduction::invariant gives the same bits at 1, 2 and 3 ranks") {
  check_bits("collective_check_bits.json", {{"inproc", 1}, {"inproc", 2}, {"inproc", 3}});
}

TEST_CASE("ddp-bench collective --check bits under mpirun: MPI's bits are the in-process ones") {
  check_bits("collective_check_bits_mpi.json", {{"mpi", 2}, {"inproc", 1}, {"inproc", 2}, {"inproc", 3}});
  // The MPI sweep reads the overlap and memory columns too.
  for (const auto& row : read_json("collective_all_reduce_mpi.json").at("rows")) {
    CAPTURE(row.dump());
    CHECK(row.at("overlap(%)").get<double>() >= 0);
    CHECK(row.at("overlap(%)").get<double>() <= 100);
    CHECK(row.at("host_hwm(MiB)").get<double>() > 1);
    CHECK(row.at("p99(us)").get<double>() <= row.at("max(us)").get<double>());
  }
}

TEST_CASE("ddp-bench step: every configuration at each world, against the unsynchronised step") {
  const auto j = read_json("step.json");
  check_common(j, "step");
  int no_sync = 0, sharded = 0;
  std::map<std::string, long long> hooked, reduced;
  std::map<int, long long> plain, no_buffers;
  std::map<std::string, std::array<double, 3>> updates;  // "policy ranks": bytes, memory, peak
  for (const auto& row : j.at("rows")) {
    CAPTURE(row.dump());
    CHECK(row.at("step(ms)").get<double>() > 0);
    if (row.at("slot") == "no sync") {
      ++no_sync;
      CHECK(row.at("vs_no_sync") == 1.0);
      continue;
    }
    CHECK(row.at("compute(ms)").get<double>() > 0);
    CHECK(row.at("vs_no_sync").get<double>() > 0);
    if (row.at("ranks") == 1) CHECK(row.at("bytes/step") == 0);
    if (row.at("ranks") == 2) CHECK(row.at("bytes/step").get<long long>() > 0);
    sharded += row.at("policy") == "sharded";
    if (row.at("slot") == "comm_hook") hooked[row.at("policy").get<std::string>() + std::to_string(row.at("ranks").get<int>())] =
        row.at("bytes/step").get<long long>();
    if (row.at("slot") == "reduction") reduced[row.at("policy").get<std::string>() + std::to_string(row.at("ranks").get<int>())] =
        row.at("bytes/step").get<long long>();
    if (row.at("slot") == "defaults") plain[row.at("ranks").get<int>()] = row.at("bytes/step").get<long long>();
    CHECK(row.at("memory(MiB)").get<double>() > 0);
    CHECK(row.at("peak(MiB)").get<double>() >= row.at("memory(MiB)").get<double>());
    if (row.at("slot") == "update" || row.at("slot") == "defaults")
      updates[row.at("policy").get<std::string>() + " " + std::to_string(row.at("ranks").get<int>())] = {
          row.at("bytes/step").get<double>(), row.at("memory(MiB)").get<double>(), row.at("peak(MiB)").get<double>()};
    if (row.at("policy") == "none") no_buffers[row.at("ranks").get<int>()] = row.at("bytes/step").get<long long>();
  }
  CHECK(no_sync == 2);
  CHECK(sharded == 2);
  // A 16-bit hook moves half the bytes of the f32 gradients (buffer_sync none moves those alone),
  // and the buffers as before.
  const long long grads = no_buffers.at(2), buffers = plain.at(2) - grads;
  CHECK(hooked.at("bf162") == grads / 2 + buffers);
  CHECK(hooked.at("fp162") == grads / 2 + buffers);
  // powersgd<4>: the factors of the weight matrices and the vectors whole, well under half.
  CHECK(hooked.at("powersgd<4>2") < grads / 2 + buffers);
  CHECK(hooked.at("powersgd<4>2") > buffers);
  // reduction::invariant: the gradients as 64-bit integers and one float of maximum per 64; the
  // plain reduction over the same micro-batches moves what the defaults do.
  CHECK(reduced.at("plain, 8 shards2") == plain.at(2));
  CHECK(reduced.at("invariant<8>2") > 2 * grads + buffers);
  CHECK(reduced.at("invariant<8>2") <= 2 * grads + grads / 16 + 4 * 16 + buffers);
  // The update strategies: sharded_gradients moves sharded's bytes (what it holds depends on the
  // buckets against the model, which at this size is one bucket: zero_test.cpp measures it).
  CHECK(updates.at("sharded_gradients 2")[0] == updates.at("sharded 2")[0]);
  CHECK(updates.at("sharded_gradients, 512 KiB 2")[0] == updates.at("sharded, 512 KiB 2")[0]);
  CHECK(updates.at("sharded 2")[1] < updates.at("(all six) 2")[1]);
  // fully_sharded gathers the parameters twice: one and a half times sharded's gradient and
  // parameter bytes (what it holds, against a model of one or two buckets, zero_test.cpp measures).
  for (const std::string cap : {"", ", 512 KiB"})
    CHECK(updates.at("fully_sharded" + cap + " 2")[0] - static_cast<double>(buffers) ==
          doctest::Approx(1.5 * (updates.at("sharded" + cap + " 2")[0] - static_cast<double>(buffers))));
  // The optimizer overlapped with the reductions moves and holds what the plain update does.
  CHECK(updates.at("replicated, overlapped 2")[0] == updates.at("(all six) 2")[0]);
  CHECK(updates.at("replicated, overlapped 2")[1] == updates.at("(all six) 2")[1]);
  // defaults, 3 bucket caps, 3 buffer syncs, 2 unused rules, 8 updates, bf16, fp16, powersgd, 2 reductions, no sync
  CHECK(j.at("rows").size() == 2 * 23);
}

TEST_CASE("ddp-bench scaling writes CSV: its header says what produced it") {
  std::ifstream in(outputs() / "scaling.csv");
  REQUIRE(in.good());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() >= 6);
  CHECK(lines[0].starts_with("# ddp-bench scaling: "));
  CHECK(lines[1].starts_with("# command: "));
  CHECK(lines[2].starts_with("# date: "));
  CHECK(lines[3].starts_with("# machine: "));
  CHECK(lines[4].starts_with("# library_version: "));
  std::size_t header = 5;
  while (header < lines.size() && lines[header].starts_with("#")) ++header;
  REQUIRE(header + 4 < lines.size() + 1);
  CHECK(lines[header] == "setup,samples/s,min,max,vs_1_rank,vs_ceiling");
  // 1 rank, 2 ranks, 2 sharded, 2 x 1 rank, 2 sharded_gradients, 2 ranks overlapped, 2 ranks 1 MiB
  // overlapped, 2 fully_sharded, 2 ranks bf16
  CHECK(lines.size() - header - 1 == 9);
  CHECK(lines.back().starts_with("2 ranks bf16,"));
}

TEST_CASE("ddp-bench scaling --model gpt: every set-up in tokens/s, on the GPT") {
  std::ifstream in(outputs() / "scaling_gpt.csv");
  REQUIRE(in.good());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() >= 6);
  CHECK(lines[0].starts_with("# ddp-bench scaling: GPT 4 layers, 4 heads, width 128, context 64"));
  std::size_t header = 5;
  while (header < lines.size() && lines[header].starts_with("#")) ++header;
  REQUIRE(header < lines.size());
  CHECK(lines[header] == "setup,tokens/s,min,max,vs_1_rank,vs_ceiling");
  // 1 rank, 2 ranks, 2 sharded, 2 x 1 rank, 2 sharded_gradients, 2 ranks overlapped, 2 ranks 1 MiB
  // overlapped, 2 fully_sharded
  REQUIRE(lines.size() - header - 1 == 8);
  for (std::size_t i = header + 1; i < lines.size(); ++i) {
    CAPTURE(lines[i]);
    const auto comma = lines[i].find(',');
    REQUIRE(comma != std::string::npos);
    CHECK(std::stod(lines[i].substr(comma + 1)) > 0);  // tokens/s
  }
  CHECK(lines[header + 1].starts_with("1 rank,"));
  CHECK(lines.back().starts_with("2 fully_sharded,"));
}
