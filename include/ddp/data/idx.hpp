#pragma once
// The IDX format of MNIST and Fashion-MNIST, gzipped or not:
//   bytes 0-1: 0, byte 2: element type (0x08 = unsigned byte), byte 3: number of dimensions,
//   then each dimension as a big-endian uint32, then the elements, row-major.
// Every check names the file, what was expected and what was found.
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"

namespace ddp::data {

struct idx_array {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> values;
};

// The file's bytes; gzip is undone when present (zlib reads plain files unchanged).
inline std::vector<std::uint8_t> read_maybe_gzipped(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f)
    throw error("data", "read", -1,
                "cannot open '" + path + "': " + std::strerror(errno) +
                    (errno == ENOENT ? " (Fashion-MNIST comes with Debian's dataset-fashion-mnist)" : ""));
  std::vector<std::uint8_t> bytes;
  std::uint8_t chunk[1 << 16];
  for (;;) {
    const int n = gzread(f, chunk, sizeof chunk);
    if (n < 0) {
      int code = 0;
      std::string what = gzerror(f, &code);
      gzclose(f);
      throw error("data", "read", -1, "'" + path + "' is not a readable gzip stream: " + what);
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), chunk, chunk + n);
  }
  int code = 0;
  const std::string what = gzerror(f, &code);
  gzclose(f);
  if (code != Z_OK && code != Z_STREAM_END)
    throw error("data", "read", -1, "'" + path + "' ends early or is corrupt: " + what);
  return bytes;
}

// Parses an IDX file of unsigned bytes with `expected_dims` dimensions.
inline idx_array read_idx(const std::string& path, std::size_t expected_dims) {
  const auto bytes = read_maybe_gzipped(path);
  auto fail = [&](const std::string& what) { throw error("data", "read_idx", -1, "'" + path + "': " + what); };
  if (bytes.size() < 4)
    fail("expected an IDX header of at least 4 bytes, found a file of " + std::to_string(bytes.size()) + " bytes");
  if (bytes[0] != 0 || bytes[1] != 0)
    fail("expected IDX magic bytes 00 00, found " + std::to_string(bytes[0]) + " " + std::to_string(bytes[1]) +
         " (not an IDX file)");
  if (bytes[2] != 0x08)
    fail("expected element type 0x08 (unsigned byte), found 0x" + std::to_string(bytes[2]));
  if (bytes[3] != expected_dims)
    fail("expected " + std::to_string(expected_dims) + " dimensions, found " + std::to_string(bytes[3]));
  const std::size_t header = 4 + 4 * expected_dims;
  if (bytes.size() < header)
    fail("expected a header of " + std::to_string(header) + " bytes, found " + std::to_string(bytes.size()));
  idx_array out;
  std::size_t count = 1;
  for (std::size_t d = 0; d < expected_dims; ++d) {
    const std::uint8_t* p = bytes.data() + 4 + 4 * d;
    const std::uint32_t dim = (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) |
                              (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
    out.dims.push_back(dim);
    count *= dim;
  }
  const std::size_t found = bytes.size() - header;
  if (found != count) {
    std::string shape;
    for (auto d : out.dims) {
      if (!shape.empty()) shape += 'x';
      shape += std::to_string(d);
    }
    std::string what = found < count ? "truncated" : "has trailing bytes";
    what += ": the header says " + shape + " = " + std::to_string(count) + " values, found " + std::to_string(found);
    fail(what);
  }
  out.values.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return out;
}

}  // namespace ddp::data
