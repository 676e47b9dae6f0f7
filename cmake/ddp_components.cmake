# Optional parts of ddp, each an INTERFACE target a consumer links when it uses that part.
#   ddp::ddp    core: concepts, policies, in-process ranks, host device, trainer, samplers
#   ddp::nn     reference layers (include/ddp/nn): CBLAS from OpenBLAS
#   ddp::data   data sets (include/ddp/data): IDX files, gzipped through zlib
# ddp_components lists the ones this build has (the install rules and the package config read it).
set(ddp_components)

# ddp_component(name deps...): INTERFACE target ddp_<name>, exported as ddp::<name>.
macro(ddp_component name)
  add_library(ddp_${name} INTERFACE)
  add_library(ddp::${name} ALIAS ddp_${name})
  set_target_properties(ddp_${name} PROPERTIES EXPORT_NAME ${name})
  target_link_libraries(ddp_${name} INTERFACE ddp ${ARGN})
  list(APPEND ddp_components ${name})
endmacro()

find_package(OpenBLAS CONFIG QUIET)
if(OpenBLAS_FOUND)
  ddp_component(nn ${OpenBLAS_LIBRARIES})
  target_include_directories(ddp_nn SYSTEM INTERFACE ${OpenBLAS_INCLUDE_DIRS})
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
  elseif(DDP_REQUIRE_MPI)
    message(FATAL_ERROR "ddp: DDP_REQUIRE_MPI is ON but MPI was not found, so the MPI tests would not run "
                        "(Debian: apt-get install libopenmpi-dev openmpi-bin)")
  else()
    message(STATUS "ddp: MPI not found (Debian: libopenmpi-dev); ddp::mpi is not built")
  endif()
endif()

#   ddp::cuda   the CUDA device and reference layers (include/ddp/cuda, include/ddp/nn/cuda):
#               CUDA runtime, cuBLAS, and ddp's kernels, compiled once by nvcc into a static
#               library (ddp::cuda_kernels, libddp_cuda_kernels.a, installed with the package): a
#               consumer needs no nvcc to use them. An optimizer of the user's own adds its
#               kernel in a .cu of its own (DDP_CUDA_OPTIMIZER, docs/cuda.md).
#   ddp::nccl   the NCCL communicator (include/ddp/nccl), on top of ddp::cuda.
if(DDP_WITH_CUDA)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND NOT CMAKE_CUDA_COMPILER AND CUDAToolkit_NVCC_EXECUTABLE)
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CUDAToolkit_FOUND AND CMAKE_CUDA_COMPILER)
    # H100/H200 by default: one architecture keeps nvcc's work small. Override with
    # -DCMAKE_CUDA_ARCHITECTURES=80;90 (or native on a GPU machine).
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    add_library(ddp_cuda_kernels STATIC ${PROJECT_SOURCE_DIR}/src/cuda/kernels.cu)
    target_include_directories(ddp_cuda_kernels PRIVATE ${PROJECT_SOURCE_DIR}/include)
    # CMake 3.25 does not know nvcc 13's C++20 feature names; the flag says it directly.
    target_compile_options(ddp_cuda_kernels PRIVATE -std=c++20)
    set_target_properties(ddp_cuda_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON)
    target_link_libraries(ddp_cuda_kernels PUBLIC CUDA::cudart)
    set_target_properties(ddp_cuda_kernels PROPERTIES EXPORT_NAME cuda_kernels)
    ddp_component(cuda CUDA::cudart CUDA::cublas ddp_cuda_kernels)
    find_library(DDP_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    find_path(DDP_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    if(DDP_NCCL_LIBRARY AND DDP_NCCL_INCLUDE_DIR)
      ddp_component(nccl ddp_cuda ${DDP_NCCL_LIBRARY})
      target_include_directories(ddp_nccl INTERFACE ${DDP_NCCL_INCLUDE_DIR})
    else()
      message(STATUS "ddp: NCCL not found beside the CUDA toolkit; ddp::nccl is not built")
    endif()
    message(STATUS "ddp: CUDA ${CUDAToolkit_VERSION} found (ddp::cuda), architectures ${CMAKE_CUDA_ARCHITECTURES}")
  else()
    message(STATUS "ddp: CUDA toolkit or nvcc not found; ddp::cuda and ddp::nccl are not built")
  endif()
endif()

#   ddp::torch  the libtorch adapter (include/ddp/torch): a torch::nn::Module as a ddp module.
#               Debian's libtorch-dev (1.13, CPU), or any libtorch: -DTorch_DIR=<libtorch>/share/cmake/Torch
if(DDP_WITH_TORCH)
  find_package(Torch CONFIG QUIET)
  if(Torch_FOUND)
    ddp_component(torch ${TORCH_LIBRARIES})
  elseif(DDP_REQUIRE_TORCH)
    message(FATAL_ERROR "ddp: DDP_REQUIRE_TORCH is ON but libtorch was not found, so the ddp::torch tests would "
                        "not run (Debian: apt-get install libtorch-dev)")
  else()
    message(STATUS "ddp: libtorch not found (Debian: libtorch-dev); ddp::torch is not built")
  endif()
endif()

#   ddp::runtime      the code that does not depend on a user's types (reference layers, data set
#                     readers, host kernels, the trainer's parts over the in-process ranks and the
#                     host device), compiled once into libddp_runtime. Linking it sets
#                     DDP_COMPILED_RUNTIME=1: the headers then only declare that code, and a
#                     training program compiles in about a quarter less time (docs/headers.md). Optional:
#                     without it every header stays header-only.
#   ddp::mpi_runtime  the same for the MPI communicator and the trainer's parts over it
#                     (DDP_COMPILED_MPI_RUNTIME=1), on top of ddp::runtime and ddp::mpi.
if(TARGET ddp_nn AND TARGET ddp_data)
  add_library(ddp_runtime STATIC ${PROJECT_SOURCE_DIR}/src/runtime/runtime.cpp)
  add_library(ddp::runtime ALIAS ddp_runtime)
  set_target_properties(ddp_runtime PROPERTIES EXPORT_NAME runtime POSITION_INDEPENDENT_CODE ON)
  target_link_libraries(ddp_runtime PUBLIC ddp_nn ddp_data)
  target_compile_definitions(ddp_runtime PRIVATE DDP_BUILDING_RUNTIME INTERFACE DDP_COMPILED_RUNTIME=1)
  list(APPEND ddp_components runtime)
  if(TARGET ddp_mpi)
    add_library(ddp_mpi_runtime STATIC ${PROJECT_SOURCE_DIR}/src/runtime/mpi.cpp)
    add_library(ddp::mpi_runtime ALIAS ddp_mpi_runtime)
    set_target_properties(ddp_mpi_runtime PROPERTIES EXPORT_NAME mpi_runtime POSITION_INDEPENDENT_CODE ON)
    target_link_libraries(ddp_mpi_runtime PUBLIC ddp_runtime ddp_mpi)
    target_compile_definitions(ddp_mpi_runtime PRIVATE DDP_BUILDING_MPI_RUNTIME INTERFACE DDP_COMPILED_MPI_RUNTIME=1)
    list(APPEND ddp_components mpi_runtime)
  endif()
else()
  message(STATUS "ddp: ddp::runtime needs ddp::nn and ddp::data (OpenBLAS, zlib); not built")
endif()

# A program of ddp's (ddp-bench, ddp-run) goes to bin/ when it was built; a build that did not
# build it (the main job builds only the example) installs the rest and says how to add it.
function(ddp_install_program target)
  if(NOT DDP_INSTALL)
    return()
  endif()
  install(TARGETS ${target} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} OPTIONAL)
  install(CODE "
    if(NOT EXISTS \"$<TARGET_FILE:${target}>\")
      message(STATUS \"ddp: skipped ${target}: not built in ${PROJECT_BINARY_DIR}; to install it: \"
                     \"cmake --build ${PROJECT_BINARY_DIR} --target ${target}, then install again\")
    endif()")
endfunction()
