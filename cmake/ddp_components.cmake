# Optional parts of ddp, each an INTERFACE target a consumer links when it uses that part.
#   ddp::ddp    core: concepts, policies, in-process ranks, host device, trainer, samplers
#   ddp::nn     reference layers (include/ddp/nn): CBLAS from OpenBLAS
#   ddp::data   data sets (include/ddp/data): IDX files, gzipped through zlib
set(ddp_installed_targets ddp)

# ddp_component(name deps...): INTERFACE target ddp_<name>, exported as ddp::<name>.
macro(ddp_component name)
  add_library(ddp_${name} INTERFACE)
  add_library(ddp::${name} ALIAS ddp_${name})
  set_target_properties(ddp_${name} PROPERTIES EXPORT_NAME ${name})
  target_link_libraries(ddp_${name} INTERFACE ddp ${ARGN})
  list(APPEND ddp_installed_targets ddp_${name})
endmacro()

find_package(OpenBLAS CONFIG QUIET)
if(OpenBLAS_FOUND)
  ddp_component(nn ${OpenBLAS_LIBRARIES})
  target_include_directories(ddp_nn INTERFACE ${OpenBLAS_INCLUDE_DIRS})
else()
  message(STATUS "ddp: OpenBLAS not found (Debian: libopenblas-dev); ddp::nn is not built")
endif()

find_package(ZLIB QUIET)
if(ZLIB_FOUND)
  ddp_component(data ZLIB::ZLIB)
else()
  message(STATUS "ddp: zlib not found (Debian: zlib1g-dev); ddp::data is not built")
endif()

#   ddp::mpi    the MPI communicator (include/ddp/mpi): OpenMPI
if(DDP_WITH_MPI)
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    ddp_component(mpi MPI::MPI_CXX)
  else()
    message(STATUS "ddp: MPI not found (Debian: libopenmpi-dev); ddp::mpi is not built")
  endif()
endif()

#   ddp::cuda   CUDA runtime and cuBLAS; ddp::nccl adds NCCL. Found from the CUDA toolkit; the
#               CUDA device and the NCCL communicator that use them are issue 5's work.
if(DDP_WITH_CUDA)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    ddp_component(cuda CUDA::cudart CUDA::cublas)
    find_library(DDP_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    find_path(DDP_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    if(DDP_NCCL_LIBRARY AND DDP_NCCL_INCLUDE_DIR)
      ddp_component(nccl ddp_cuda ${DDP_NCCL_LIBRARY})
      target_include_directories(ddp_nccl INTERFACE ${DDP_NCCL_INCLUDE_DIR})
    else()
      message(STATUS "ddp: NCCL not found beside the CUDA toolkit; ddp::nccl is not built")
    endif()
    message(STATUS "ddp: CUDA ${CUDAToolkit_VERSION} found (ddp::cuda)")
  else()
    message(STATUS "ddp: CUDA toolkit not found; ddp::cuda and ddp::nccl are not built")
  endif()
endif()
