#pragma once
// The IDX format of MNIST and Fashion-MNIST, gzipped or not:
//   bytes 0-1: 0, byte 2: element type (0x08 = unsigned byte), byte 3: number of dimensions,
//   then each dimension as a big-endian uint32, then the elements, row-major.
// Every check names the file, what was expected and what was found.
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/compiled_runtime.hpp"

#if DDP_RUNTIME_DEFINITIONS
#include <zlib.h>
#endif

namespace ddp::data {

struct idx_array {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> values;
};

// The header of an IDX file of unsigned bytes with `expected_dims` dimensions, checked against
// the file's length: its dimensions and where the values begin.
struct idx_header {
  std::vector<std::uint32_t> dims;
  std::size_t values_offset = 0;
  std::size_t value_count = 0;
};

// The file's bytes; gzip is undone when present (zlib reads plain files unchanged).
std::vector<std::uint8_t> read_maybe_gzipped(const std::string& path);

// The header's checks against the file's length; throws a ddp::error naming the file.
idx_header parse_idx_header(const std::uint8_t* bytes, std::size_t size, const std::string& path,
                            std::size_t expected_dims);

// Reads an IDX file of unsigned bytes with `expected_dims` dimensions into memory.
idx_array read_idx(const std::string& path, std::size_t expected_dims);

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE std::vector<std::uint8_t> read_maybe_gzipped(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f)
    throw error("data", "read", -1,
                "cannot open '" + path + "': " + std::strerror(errno) +
                    (errno == ENOENT &&
                             (path.find("fashion") != std::string::npos || path.find("-idx") != std::string::npos)
                         ? " (Fashion-MNIST comes with Debian's dataset-fashion-mnist)"
                         : ""));
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

DDP_RUNTIME_INLINE idx_header parse_idx_header(const std::uint8_t* bytes, std::size_t size, const std::string& path,
                                   std::size_t expected_dims) {
  auto fail = [&](const std::string& what) { throw error("data", "read_idx", -1, "'" + path + "': " + what); };
  auto hex = [](std::uint8_t b) {
    const char* digits = "0123456789abcdef";
    return std::string{digits[b >> 4], digits[b & 15]};
  };
  if (size < 4) fail("expected an IDX header of at least 4 bytes, found a file of " + std::to_string(size) + " bytes");
  if (bytes[0] != 0 || bytes[1] != 0)
    fail("expected IDX magic bytes 00 00, found " + hex(bytes[0]) + " " + hex(bytes[1]) +
         (bytes[0] == 0x1f && bytes[1] == 0x8b ? " (a gzip stream: decompress it first: gunzip -c FILE.gz > FILE)"
                                               : " (not an IDX file)"));
  if (bytes[2] != 0x08)
    fail("expected element type 0x08 (unsigned byte), found 0x" + hex(bytes[2]));
  if (bytes[3] != expected_dims)
    fail("expected " + std::to_string(expected_dims) + " dimensions, found " + std::to_string(bytes[3]));
  idx_header h;
  h.values_offset = 4 + 4 * expected_dims;
  if (size < h.values_offset)
    fail("expected a header of " + std::to_string(h.values_offset) + " bytes, found " + std::to_string(size));
  h.value_count = 1;
  for (std::size_t d = 0; d < expected_dims; ++d) {
    const std::uint8_t* p = bytes + 4 + 4 * d;
    const std::uint32_t dim = (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) |
                              (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
    h.dims.push_back(dim);
    if (__builtin_mul_overflow(h.value_count, std::size_t{dim}, &h.value_count))
      fail("the header's dimensions multiply past what memory can address (not an IDX file)");
  }
  const std::size_t found = size - h.values_offset;
  if (found != h.value_count) {
    std::string shape;
    for (auto d : h.dims) {
      if (!shape.empty()) shape += 'x';
      shape += std::to_string(d);
    }
    std::string what = found < h.value_count ? "truncated" : "has trailing bytes";
    what += ": the header says " + shape + " = " + std::to_string(h.value_count) + " values, found " +
            std::to_string(found);
    fail(what);
  }
  return h;
}

DDP_RUNTIME_INLINE idx_array read_idx(const std::string& path, std::size_t expected_dims) {
  const auto bytes = read_maybe_gzipped(path);
  auto h = parse_idx_header(bytes.data(), bytes.size(), path, expected_dims);
  idx_array out;
  out.dims = std::move(h.dims);
  out.values.assign(bytes.begin() + static_cast<std::ptrdiff_t>(h.values_offset), bytes.end());
  return out;
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::data
