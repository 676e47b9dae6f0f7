// libFuzzer target: the checkpoint reader (ddp::detail::checkpoint_file::decode) on any bytes,
// and the typed reads the trainer makes of what it decodes. Every input either decodes or raises
// ddp::error; anything else is a finding. scripts/fuzz.sh builds and runs it.
#include <cstddef>
#include <cstdint>
#include <span>

#include "ddp/trainer/checkpoint_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto f = ddp::detail::checkpoint_file::decode(std::span(data, size), "input");
    // What load_checkpoint and the trainer state (trainer/state_io.hpp) read; each may be missing or mis-sized.
    for (const char* name : {"format", "world", "steps", "signature", "buckets"}) try {
        (void)f.text(name);
        (void)f.number(name);
      } catch (const ddp::error&) {
      }
    try {
      (void)f.array<float>("state/0", 4);
      (void)f.array<std::int64_t>("update_counts", 2);
    } catch (const ddp::error&) {
    }
    if (f.encode().size() != size) __builtin_trap();  // what decodes re-encodes to as many bytes
  } catch (const ddp::error&) {
  }
  return 0;
}
