include(${doctest_DIR}/doctest.cmake OPTIONAL RESULT_VARIABLE ddp_doctest_module)

# Test programs are built at -O1 whatever the build type: their template-heavy translation units
# compile in about 2/3 of the -O3 time, and they run in seconds either way. No float result
# changes with it (no -ffast-math, no FMA contraction on baseline x86-64), so the bitwise checks
# hold as at -O3. Benchmarks and examples keep the build type's flags. The sanitizer stage of the
# test command sets -O0: instrumented, the trainer's largest unit takes 47 s at -O0 and 145 s at -O1.
if(NOT DEFINED DDP_TEST_OPTIMIZATION)
  set(DDP_TEST_OPTIMIZATION -O1)
endif()

# Test programs link the compiled runtime (ddp::runtime, docs/headers.md) where it is built: the
# library's fixed code (reference layers, host kernels, the trainer's parts over in-process ranks)
# is then compiled once instead of in every test unit, about an eighth of each unit's compiler
# time. Results do not change (tests/compile_time compares both builds bit for bit).
# DDP_TESTS_LINK_RUNTIME=OFF builds them header-only.
option(DDP_TESTS_LINK_RUNTIME "Link the test programs against ddp::runtime where it is built" ON)

# The runtime libraries a test program links: `out` gets ddp::runtime (and ddp::mpi_runtime when
# `with_mpi`), or nothing when the option is off or they are not built.
function(ddp_test_runtime out with_mpi)
  set(libs)
  if(DDP_TESTS_LINK_RUNTIME AND TARGET ddp::runtime)
    list(APPEND libs ddp::runtime)
    if(with_mpi AND TARGET ddp::mpi_runtime)
      list(APPEND libs ddp::mpi_runtime)
    endif()
  endif()
  set(${out} ${libs} PARENT_SCOPE)
endfunction()

# ddp_add_doctest(name sources... [LABELS l...] [LIBS lib...] [UNITY_UNITS n])
function(ddp_add_doctest name)
  cmake_parse_arguments(arg "" "UNITY_UNITS" "LABELS;LIBS" ${ARGN})
  # ctest splits a discovered test's name at ';': a case named with one would run as two that fail.
  foreach(source IN LISTS arg_UNPARSED_ARGUMENTS)
    file(STRINGS ${CMAKE_CURRENT_SOURCE_DIR}/${source} named_with_semicolon REGEX "TEST_CASE[_A-Z]*[(]\"[^\"]*[;]")
    if(named_with_semicolon)
      message(FATAL_ERROR "ddp: a test case in tests/${source} has a ';' in its name, which ctest splits into two "
                          "tests: use a comma")
    endif()
  endforeach()
  add_executable(${name} ${arg_UNPARSED_ARGUMENTS})
  if(arg_UNITY_UNITS)
    ddp_unity_units(${name} ${arg_UNITY_UNITS} ${arg_UNPARSED_ARGUMENTS})
  endif()
  ddp_test_runtime(runtime OFF)
  target_link_libraries(${name} PRIVATE ddp::ddp ddp_test_main doctest::doctest ${arg_LIBS} ${runtime})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_options(${name} PRIVATE ${DDP_WARNINGS} ${DDP_TEST_OPTIMIZATION})
  if(NOT arg_LABELS)
    set(arg_LABELS host)
  endif()
  doctest_discover_tests(${name} PROPERTIES LABELS "${arg_LABELS}" TIMEOUT 600)
endfunction()

# One translation unit per public header, each including only that header.
function(ddp_add_header_check name)
  file(GLOB_RECURSE headers RELATIVE ${PROJECT_SOURCE_DIR}/include CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/include/ddp/*.hpp)
  set(libs ddp::ddp)
  set(sources)
  foreach(h IN LISTS headers)
    # Headers of optional engines are checked only when that engine is built.
    if(h MATCHES "^ddp/(mpi/|runtime/mpi)" AND NOT TARGET ddp::mpi)
      continue()
    endif()
    if(h MATCHES "^ddp/(nccl|cuda|nn/cuda)/" AND NOT TARGET ddp::nccl)
      continue()
    endif()
    # libtorch's headers cost about 25 s a unit: the ddp::torch tests compile these headers.
    if(h MATCHES "^ddp/torch/")
      continue()
    endif()
    string(MAKE_C_IDENTIFIER ${h} id)
    set(src ${CMAKE_CURRENT_BINARY_DIR}/header_check/${id}.cpp)
    file(CONFIGURE OUTPUT ${src} CONTENT "#include <${h}>\n#include <${h}>  // and twice\n")
    list(APPEND sources ${src})
  endforeach()
  foreach(t IN ITEMS ddp::nn ddp::data ddp::mpi ddp::nccl)
    if(TARGET ${t})
      list(APPEND libs ${t})
    endif()
  endforeach()
  add_library(${name} OBJECT ${sources})
  target_link_libraries(${name} PRIVATE ${libs})
  target_compile_options(${name} PRIVATE ${DDP_WARNINGS})
  # Read, not compiled into code: nothing links these units (cmake/syntax_only.sh).
  set_target_properties(${name} PROPERTIES CXX_COMPILER_LAUNCHER ${PROJECT_SOURCE_DIR}/cmake/syntax_only.sh)

  # The kernel headers (.cuh), each on its own through nvcc; part of the ddp_gpu target.
  if(TARGET ddp::cuda)
    file(GLOB_RECURSE cuda_headers RELATIVE ${PROJECT_SOURCE_DIR}/include CONFIGURE_DEPENDS
         ${PROJECT_SOURCE_DIR}/include/ddp/*.cuh)
    set(cuda_sources)
    foreach(h IN LISTS cuda_headers)
      string(MAKE_C_IDENTIFIER ${h} id)
      set(src ${CMAKE_CURRENT_BINARY_DIR}/header_check/${id}.cu)
      file(CONFIGURE OUTPUT ${src} CONTENT "#include <${h}>\n#include <${h}>  // and twice\n")
      list(APPEND cuda_sources ${src})
    endforeach()
    add_library(${name}_cuda OBJECT EXCLUDE_FROM_ALL ${cuda_sources})
    target_include_directories(${name}_cuda PRIVATE ${PROJECT_SOURCE_DIR}/include)
    target_link_libraries(${name}_cuda PRIVATE CUDA::cudart)
    target_compile_options(${name}_cuda PRIVATE -std=c++20)
    add_dependencies(ddp_gpu ${name}_cuda)
  endif()
endfunction()

# The flags of every compile-fail case, and of the precompiled <ddp/ddp.hpp> they share.
function(ddp_compile_fail_flags out)
  set(flags -std=gnu++20 -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/tests)
  foreach(dir IN LISTS OpenBLAS_INCLUDE_DIRS CUDAToolkit_INCLUDE_DIRS)
    list(APPEND flags -I${dir})
  endforeach()
  set(${out} ${flags} PARENT_SCOPE)
endfunction()

# Most cases start with #include <ddp/ddp.hpp>, about 3 s of parsing each; GCC takes a precompiled
# ddp/ddp.hpp.gch found first on the include path instead (1 s a case). The depfile rebuilds it when
# any header changes; a case run before it exists parses the header itself.
set(DDP_COMPILE_FAIL_PCH_DIR ${CMAKE_CURRENT_BINARY_DIR}/compile_fail_pch)
function(ddp_add_compile_fail_pch)
  ddp_compile_fail_flags(flags)
  set(pch ${DDP_COMPILE_FAIL_PCH_DIR}/ddp/ddp.hpp.gch)
  # Built from a file that includes the header (GCC warns about #pragma once in a main file).
  set(source ${CMAKE_CURRENT_BINARY_DIR}/compile_fail_pch_source.hpp)
  file(CONFIGURE OUTPUT ${source} CONTENT "#include <ddp/ddp.hpp>\n")
  add_custom_command(OUTPUT ${pch}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${DDP_COMPILE_FAIL_PCH_DIR}/ddp
    COMMAND ${CMAKE_CXX_COMPILER} ${flags} -x c++-header ${source} -o ${pch}
            -MD -MF ${pch}.d -MT ${pch}
    DEPFILE ${pch}.d
    COMMENT "Precompiling <ddp/ddp.hpp> for the compile-fail cases"
    VERBATIM)
  add_custom_target(ddp_compile_fail_pch ALL DEPENDS ${pch})
endfunction()

# A case that must not compile; its first line reads `// expect: <regular expression>`, and its
# second may read `// errors: N` (tests/compile_fail/check.cmake). The compiler runs on it
# directly (-fsyntax-only: static_asserts and concept checks fire, nothing is generated), so the
# cases run in parallel and outside the build tree.
function(ddp_add_compile_fail_test source)
  get_filename_component(case ${source} NAME_WE)
  # Cases named cuda_* need the CUDA headers: checked only when ddp::cuda is built.
  if(case MATCHES "^cuda_" AND NOT TARGET ddp::cuda)
    return()
  endif()
  ddp_compile_fail_flags(flags)
  add_test(NAME compile_fail_${case}
    COMMAND ${CMAKE_COMMAND} -DCOMPILER=${CMAKE_CXX_COMPILER} -DSOURCE=${source}
            "-DFLAGS=-I${DDP_COMPILE_FAIL_PCH_DIR};${flags}"
            -P ${PROJECT_SOURCE_DIR}/tests/compile_fail/check.cmake)
  set_tests_properties(compile_fail_${case} PROPERTIES LABELS "build")
endfunction()
