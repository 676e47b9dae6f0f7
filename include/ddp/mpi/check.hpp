#pragma once
// Every MPI status goes through one check into ddp::error, naming the operation and rank.
#include <mpi.h>

#include <string>

#include "ddp/core/error.hpp"

namespace ddp::mpi {

inline std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

inline void check(int code, const char* operation, int rank) {
  if (code != MPI_SUCCESS) throw error("mpi", operation, rank, error_string(code));
}

}  // namespace ddp::mpi
