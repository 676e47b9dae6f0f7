// ddp::mpi: the MPI communicator's headers and OpenMPI's library (no MPI_Init: no mpirun here).
#include <ddp/mpi/communicator.hpp>

#include <string>

std::string uses_mpi() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  if (MPI_Get_library_version(version, &length) != MPI_SUCCESS) return "MPI_Get_library_version failed";
  return "ok: ddp::mpi linked against " + std::string(version, static_cast<std::size_t>(length)).substr(0, 40);
}
