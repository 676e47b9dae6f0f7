#pragma once
// Header-only or compiled: where the library's fixed code is compiled.
//
// Header-only (the default): every function is defined in the headers and compiled in each
// translation unit that uses it.
//
// Compiled (DDP_COMPILED_RUNTIME=1, which linking the CMake target ddp::runtime sets): the code
// that does not depend on the user's types (the reference layers, the data set readers, the host
// kernels, the trainer's parts over the in-process communicator and the host device) is compiled
// once into libddp_runtime; the headers then declare it, and a translation unit compiles only
// what depends on its own types (its model, its policies). Every translation unit of a program
// must agree: all compiled, or all header-only (the CMake target sees to it).
// DDP_COMPILED_MPI_RUNTIME=1 (ddp::mpi_runtime) does the same for the MPI communicator and the
// trainer's parts over it. The trainer's parts are declared by <ddp/ddp.hpp> (ddp/runtime/).
//
// DDP_BUILDING_RUNTIME is defined by libddp_runtime's own sources alone.
#if defined(DDP_BUILDING_RUNTIME)
#define DDP_RUNTIME_DEFINITIONS 1  // this unit defines the compiled functions, out of line
#define DDP_RUNTIME_EXTERN 0
#define DDP_RUNTIME_INLINE
#elif defined(DDP_COMPILED_RUNTIME) && DDP_COMPILED_RUNTIME
#define DDP_RUNTIME_DEFINITIONS 0  // declarations only: libddp_runtime defines them
#define DDP_RUNTIME_EXTERN 1       // and the fixed template instances (extern template)
#define DDP_RUNTIME_INLINE
#else
#define DDP_RUNTIME_DEFINITIONS 1  // header-only: defined here, inline
#define DDP_RUNTIME_EXTERN 0
#define DDP_RUNTIME_INLINE inline
#endif

// The same three for the MPI parts (ddp::mpi_runtime, libddp_mpi_runtime).
#if defined(DDP_BUILDING_MPI_RUNTIME)
#define DDP_MPI_RUNTIME_DEFINITIONS 1
#define DDP_MPI_RUNTIME_EXTERN 0
#define DDP_MPI_RUNTIME_INLINE
#elif defined(DDP_COMPILED_MPI_RUNTIME) && DDP_COMPILED_MPI_RUNTIME
#define DDP_MPI_RUNTIME_DEFINITIONS 0
#define DDP_MPI_RUNTIME_EXTERN 1
#define DDP_MPI_RUNTIME_INLINE
#else
#define DDP_MPI_RUNTIME_DEFINITIONS 1
#define DDP_MPI_RUNTIME_EXTERN 0
#define DDP_MPI_RUNTIME_INLINE inline
#endif
