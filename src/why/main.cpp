// ddp-why: reads the flight recorders' dumps of every rank (ddp/comm/flight_recorder.hpp) and says
// why the ranks hung or failed: the first collective where they differ, how, the ranks on each
// side with the trainer's tags, each rank's last completed collective, and the ranks whose dump
// is missing (docs/debugging.md).
//
//   ddp-why DIR [--backend inproc|mpi|nccl]
//
// Exit status: 0 every rank issued the same collectives; 2 the ranks differ; 3 a rank's dump is
// missing; 4 a dump is unreadable; 1 a usage error.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include "verdict.hpp"

int main(int argc, char** argv) {
  CLI::App app{"ddp-why: reads every rank's flight recorder dump (DDP_FLIGHT_RECORDER_DIR) and names the first "
               "collective where the ranks differ"};
  std::string dir, backend;
  app.add_option("dir", dir, "the dump folder (<backend>.rank<r>.jsonl files)")->required()->check(CLI::ExistingDirectory);
  app.add_option("-b,--backend", backend,
                 "the communicator whose dumps to read (inproc, mpi, nccl); every one found when not given");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;  // --help: 0; a usage error: 1
  }

  auto backends = backend.empty() ? ddp::why::backends_in(dir) : std::vector<std::string>{backend};
  if (backends.empty()) {
    std::cout << "ddp-why: no dumps (<backend>.rank<r>.jsonl) in " << dir << "\n";
    return ddp::why::missing_dump;
  }
  int status = ddp::why::consistent;
  for (const auto& b : backends) {
    const auto v = ddp::why::judge_folder(dir, b);
    std::cout << v.text;
    status = std::max(status, v.status);
  }
  return status;
}
