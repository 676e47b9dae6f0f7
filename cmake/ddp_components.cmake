# Optional parts of ddp, each an INTERFACE target a consumer links when it uses that part.
#   ddp::ddp    core: concepts, policies, in-process ranks, host device, trainer, samplers
#   ddp::nn     reference layers (include/ddp/nn): CBLAS from OpenBLAS
#   ddp::data   data sets (include/ddp/data): IDX files, gzipped through zlib
set(ddp_installed_targets ddp)

find_package(OpenBLAS CONFIG QUIET)
if(OpenBLAS_FOUND)
  add_library(ddp_nn INTERFACE)
  add_library(ddp::nn ALIAS ddp_nn)
  set_target_properties(ddp_nn PROPERTIES EXPORT_NAME nn)
  target_include_directories(ddp_nn INTERFACE ${OpenBLAS_INCLUDE_DIRS})
  target_link_libraries(ddp_nn INTERFACE ddp ${OpenBLAS_LIBRARIES})
  list(APPEND ddp_installed_targets ddp_nn)
else()
  message(STATUS "ddp: OpenBLAS not found (Debian: libopenblas-dev); ddp::nn is not built")
endif()

find_package(ZLIB QUIET)
if(ZLIB_FOUND)
  add_library(ddp_data INTERFACE)
  add_library(ddp::data ALIAS ddp_data)
  set_target_properties(ddp_data PROPERTIES EXPORT_NAME data)
  target_link_libraries(ddp_data INTERFACE ddp ZLIB::ZLIB)
  list(APPEND ddp_installed_targets ddp_data)
else()
  message(STATUS "ddp: zlib not found (Debian: zlib1g-dev); ddp::data is not built")
endif()

#   ddp::mpi    the MPI communicator (include/ddp/mpi): OpenMPI
if(DDP_WITH_MPI)
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    add_library(ddp_mpi INTERFACE)
    add_library(ddp::mpi ALIAS ddp_mpi)
    set_target_properties(ddp_mpi PROPERTIES EXPORT_NAME mpi)
    target_link_libraries(ddp_mpi INTERFACE ddp MPI::MPI_CXX)
    list(APPEND ddp_installed_targets ddp_mpi)
  else()
    message(STATUS "ddp: MPI not found (Debian: libopenmpi-dev); ddp::mpi is not built")
  endif()
endif()
