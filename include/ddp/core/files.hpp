#pragma once
// Whole files: one read at once, and one written so that a crash leaves the old file or the new
// one, never a part (a temporary name, flushed to disk, renamed). Checkpoints and elastic
// training's hand-over between processes use them.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"

namespace ddp::detail {

// Writes `bytes` to `path` so that `path` holds either its old contents or all of the new ones:
// a temporary file in the same directory, flushed, renamed over `path`, the directory flushed.
inline void write_file_atomically(const std::filesystem::path& path, std::span<const std::uint8_t> bytes, int rank,
                                  const char* backend = "trainer", const char* operation = "save") {
  const auto tmp = path.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rank);
  auto fail = [&](const std::string& what) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw error(backend, operation, rank, what + " '" + tmp + "': " + std::strerror(e));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create");
  std::size_t done = 0;
  while (done < bytes.size()) {
    const auto n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      fail("cannot write");
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("cannot flush");
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename to '" + path.string() + "'");
  const int dir = ::open(path.parent_path().empty() ? "." : path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

inline std::vector<std::uint8_t> read_whole_file(const std::filesystem::path& path, const char* backend = "trainer",
                                                 const char* operation = "load", int rank = -1) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw error(backend, operation, rank, "cannot open '" + path.string() + "': " + std::strerror(errno));
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace ddp::detail
