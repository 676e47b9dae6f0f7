// libFuzzer target: the IDX reader (ddp::data::read_idx) on any bytes, plain or gzipped. Every
// input either parses into the shape its header states or raises ddp::error; anything else (a
// crash, a sanitizer report, another exception) is a finding. scripts/fuzz.sh builds and runs it.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "ddp/data/idx.hpp"

namespace {
const std::string& scratch_file() {  // one file per fuzzing process, rewritten per input
  static const std::string path = "/tmp/ddp_idx_fuzz_" + std::to_string(::getpid());
  return path;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The header parser alone, on memory.
  for (std::size_t dims : {1, 3}) {
    try {
      const auto h = ddp::data::parse_idx_header(data, size, "input", dims);
      if (h.values_offset + h.value_count != size) __builtin_trap();  // a header that does not fit was accepted
    } catch (const ddp::error&) {
    }
  }
  // The whole reader, through zlib (gzipped or not), from a file.
  if (std::FILE* f = std::fopen(scratch_file().c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
    try {
      const auto a = ddp::data::read_idx(scratch_file(), 3);
      std::size_t count = 1;
      for (auto d : a.dims) count *= d;
      if (count != a.values.size()) __builtin_trap();
    } catch (const ddp::error&) {
    }
  }
  return 0;
}
