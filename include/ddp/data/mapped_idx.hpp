#pragma once
// An uncompressed IDX file mapped into memory read-only: the values are read from the page
// cache as they are touched, so a data set larger than memory can be trained on, and ranks
// (threads or processes) on one host share one copy. The header is checked as read_idx checks
// it; a gzipped file is refused with the fix (a gzip stream cannot be mapped).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/data/idx.hpp"
#include "ddp/core/compiled_runtime.hpp"

namespace ddp::data {

class mapped_idx {
 public:
  mapped_idx(const std::string& path, std::size_t expected_dims);
  mapped_idx(mapped_idx&& o) noexcept
      : path_(std::move(o.path_)), bytes_(std::exchange(o.bytes_, nullptr)), size_(std::exchange(o.size_, 0)),
        header_(std::move(o.header_)) {}
  mapped_idx& operator=(mapped_idx&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      bytes_ = std::exchange(o.bytes_, nullptr);
      size_ = std::exchange(o.size_, 0);
      header_ = std::move(o.header_);
    }
    return *this;
  }
  mapped_idx(const mapped_idx&) = delete;
  mapped_idx& operator=(const mapped_idx&) = delete;
  ~mapped_idx() { unmap(); }

  const std::string& path() const noexcept { return path_; }
  const std::vector<std::uint32_t>& dims() const noexcept { return header_.dims; }
  std::span<const std::uint8_t> values() const noexcept {
    return {bytes_ + header_.values_offset, header_.value_count};
  }

 private:
  void unmap() noexcept {
    if (bytes_) ::munmap(const_cast<std::uint8_t*>(bytes_), size_);
    bytes_ = nullptr;
  }

  std::string path_;
  const std::uint8_t* bytes_ = nullptr;
  std::size_t size_ = 0;
  idx_header header_;
};

#if DDP_RUNTIME_DEFINITIONS

DDP_RUNTIME_INLINE mapped_idx::mapped_idx(const std::string& path, std::size_t expected_dims) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw error("data", "mapped_idx", -1,
                "cannot open '" + path + "': " + std::strerror(errno) +
                    (errno == ENOENT ? " (a mapped data set needs the uncompressed IDX files: decompress each "
                                       ".gz one into a directory of your own, gunzip -c FILE.gz > DIR/FILE)"
                                     : ""));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw error("data", "mapped_idx", -1, "cannot stat '" + path + "': " + std::strerror(e));
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      throw error("data", "mapped_idx", -1, "cannot map '" + path + "': " + std::strerror(e));
    }
    bytes_ = static_cast<const std::uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  try {
    header_ = parse_idx_header(bytes_, size_, path, expected_dims);
  } catch (...) {
    unmap();
    throw;
  }
}

#endif  // DDP_RUNTIME_DEFINITIONS

}  // namespace ddp::data
