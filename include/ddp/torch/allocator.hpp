#pragma once
// libtorch frees and allocates the same large activations and gradients every step. By default
// glibc hands such blocks back to the kernel (munmap, or trimming a heap once its free top
// passes 128 KiB), so each step faults every page back in; with ranks as threads of one process
// those faults also contend for the one address space. retain_freed_memory() keeps freed memory
// in the process instead: blocks up to 32 MiB come from the heap (glibc's ceiling for this
// setting), freed heap tops are kept up to `keep_bytes`, and heaps grow in steps of 64 MiB.
// Process-wide and once: call it before the ranks start (the torch example's platform does).
// The environment variables MALLOC_TRIM_THRESHOLD_ etc. do the same without a code change.
#include <malloc.h>

#include <cstddef>
#include <mutex>

namespace ddp::torch {

inline void retain_freed_memory(std::size_t keep_bytes = std::size_t{1} << 30) {
  static std::once_flag once;
  std::call_once(once, [keep_bytes] {
#if defined(__GLIBC__)
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, static_cast<int>(keep_bytes < (std::size_t{1} << 30) ? keep_bytes : std::size_t{1} << 30));
    mallopt(M_TOP_PAD, 64 << 20);
#else
    (void)keep_bytes;  // other C libraries: nothing to set here
#endif
  });
}

}  // namespace ddp::torch
