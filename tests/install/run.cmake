# Installing and consuming ddp, as docs/install.md and README.md say:
#  1. the install commands of docs/install.md (README.md shows the same block), run word for word
#     in a fresh tree that looks like a clone (links to SOURCE_DIR's files), with HOME in WORK_DIR:
#     it configures as the main job does and installs without building anything, so the parts a
#     main job does not build (the CUDA kernels, ddp-bench) must be skipped, not fail;
# 1b. a library-only configuration (tests, examples, benchmarks off) names ddp-run as skipped where
#     MPI is found, and the page's ddp-run commands install it; the installed ddp-run then starts
#     the page's program (step 2) on two processes;
#  2. the page's program (its CMakeLists.txt block, tests/install/app/main.cpp) configured, built
#     and run by the page's commands: find_package(ddp) without components must look for no
#     libtorch, CUDA or MPI (nothing of them in its output or its cache);
#  3. the package refuses what it cannot give, naming why: an unknown component, and the cuda
#     component of an installation whose kernels were not built;
#  4. DDP_BINARY_DIR (a build of everything) installed, and tests/install/consumer linking every
#     component it provides (named as OPTIONAL_COMPONENTS), each used by a source of its own.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR}/home)

# run(<out var> <expect: 0 | fail> <dir> command...): runs the command in dir with HOME=WORK_DIR/home.
function(run out expect dir)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env HOME=${WORK_DIR}/home ${ARGN}
                  WORKING_DIRECTORY ${dir} RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE text)
  if(expect STREQUAL "0" AND NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}) in ${dir}: ${ARGN}\n${text}")
  elseif(expect STREQUAL "fail" AND rc EQUAL 0)
    message(FATAL_ERROR "succeeded, but should have failed, in ${dir}: ${ARGN}\n${text}")
  endif()
  message(STATUS "${ARGN}\n${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# The fenced blocks of a page, in order: <prefix>_<n> holds the n-th block of kind <kind>.
function(fenced_blocks page kind prefix)
  # One list element per line: the characters a CMake list treats specially are set aside first.
  file(READ ${page} text)
  string(REPLACE ";" "<semicolon>" text "${text}")
  string(REPLACE "[" "<open>" text "${text}")
  string(REPLACE "]" "<close>" text "${text}")
  string(REPLACE "\\" "<backslash>" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(n 0)
  set(inside OFF)
  foreach(line IN LISTS lines)
    string(REPLACE "<semicolon>" ";" line "${line}")
    string(REPLACE "<open>" "[" line "${line}")
    string(REPLACE "<close>" "]" line "${line}")
    string(REPLACE "<backslash>" "\\" line "${line}")
    if(NOT inside AND line STREQUAL "```${kind}")
      set(inside ON)
      set(block "")
    elseif(inside AND line STREQUAL "```")
      set(inside OFF)
      set(${prefix}_${n} "${block}" PARENT_SCOPE)
      math(EXPR n "${n} + 1")
    elseif(inside)
      string(APPEND block "${line}\n")
    endif()
  endforeach()
  set(${prefix}_count ${n} PARENT_SCOPE)
endfunction()

# The first block of <kind> in <page> that contains every one of the strings after it.
function(block_with out page kind)
  fenced_blocks(${page} ${kind} b)
  math(EXPR last "${b_count} - 1")
  foreach(i RANGE 0 ${last})
    set(all ON)
    foreach(s IN LISTS ARGN)
      string(FIND "${b_${i}}" "${s}" at)
      if(at EQUAL -1)
        set(all OFF)
      endif()
    endforeach()
    if(all)
      set(${out} "${b_${i}}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  message(FATAL_ERROR "${page} has no ```${kind} block containing ${ARGN}: the install test runs that block")
endfunction()

set(page ${SOURCE_DIR}/docs/install.md)
block_with(install_sh ${page} sh "cmake -S . -B build" "cmake --install build")
block_with(app_cmake ${page} cmake "find_package(ddp CONFIG REQUIRED)" "add_executable(app main.cpp)")
block_with(app_sh ${page} sh "cmake -S app -B app/build" "./app/build/app")
block_with(readme_sh ${SOURCE_DIR}/README.md sh "cmake --install build")
if(NOT readme_sh STREQUAL install_sh)
  message(FATAL_ERROR "README.md's install commands differ from docs/install.md's (this test runs the latter):\n"
                      "README.md:\n${readme_sh}\ndocs/install.md:\n${install_sh}")
endif()

# 1. A tree like a fresh clone: a copy of every top-level entry of the source but the build trees
#    and dot-files (about 3 MB).
set(clone ${WORK_DIR}/ddp)
file(MAKE_DIRECTORY ${clone})
file(GLOB entries RELATIVE ${SOURCE_DIR} LIST_DIRECTORIES true ${SOURCE_DIR}/*)
foreach(entry IN LISTS entries)
  if(NOT entry MATCHES "^(build|\\.)")
    file(COPY ${SOURCE_DIR}/${entry} DESTINATION ${clone})
  endif()
endforeach()
file(WRITE ${WORK_DIR}/install.sh "set -e\n${install_sh}")
run(installed 0 ${clone} bash ${WORK_DIR}/install.sh)
set(prefix ${WORK_DIR}/home/.local)
if(NOT EXISTS ${prefix}/lib/cmake/ddp/ddpConfig.cmake)
  message(FATAL_ERROR "the install commands put no ddpConfig.cmake under ${prefix}/lib/cmake/ddp")
endif()
if(EXISTS ${prefix}/lib/cmake/ddp/ddp-cuda-targets.cmake
   AND NOT installed MATCHES "skipped libddp_cuda_kernels.a.*--target ddp_cuda_kernels")
  message(FATAL_ERROR "installing a tree without its CUDA kernels did not say they were skipped and how to build them")
endif()

# 1b. ddp-run, the launcher of elastic MPI training, goes with the library wherever MPI is found,
#     tests and examples off too: an install without building names it and the command that builds
#     it; the page's command for it then installs it.
set(with_mpi OFF)
if(EXISTS ${prefix}/lib/cmake/ddp/ddp-mpi-targets.cmake)
  set(with_mpi ON)
endif()
if(with_mpi AND NOT installed MATCHES "skipped ddp-run[^\n]*--target ddp-run")
  message(FATAL_ERROR "installing a tree with MPI did not install ddp-run nor say it was skipped and how to build it:\n${installed}")
endif()
block_with(run_sh ${page} sh "--target ddp-run" "cmake --install build")
string(REPLACE "--build build" "--build build-library" run_sh "${run_sh}")
string(REPLACE "--install build" "--install build-library" run_sh "${run_sh}")
run(ignored 0 ${clone} ${CMAKE_COMMAND} -S . -B build-library -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE}
    -DDDP_BUILD_TESTS=OFF -DDDP_BUILD_EXAMPLES=OFF -DDDP_BUILD_BENCHMARKS=OFF)
run(library_only 0 ${clone} ${CMAKE_COMMAND} --install build-library --prefix ${prefix})
if(with_mpi AND NOT library_only MATCHES "skipped ddp-run[^\n]*--target ddp-run")
  message(FATAL_ERROR "installing a library-only configuration with MPI did not name ddp-run as skipped:\n${library_only}")
endif()
if(with_mpi)
  file(WRITE ${WORK_DIR}/run.sh "set -e\n${run_sh}")
  run(ignored 0 ${clone} bash ${WORK_DIR}/run.sh)
  if(NOT EXISTS ${prefix}/bin/ddp-run)
    message(FATAL_ERROR "docs/install.md's ddp-run commands, in a library-only configuration, installed no ${prefix}/bin/ddp-run")
  endif()
endif()

# 2. The page's program.
file(MAKE_DIRECTORY ${WORK_DIR}/app)
file(WRITE ${WORK_DIR}/app/CMakeLists.txt "${app_cmake}")
file(COPY ${SOURCE_DIR}/tests/install/app/main.cpp DESTINATION ${WORK_DIR}/app)
file(WRITE ${WORK_DIR}/app.sh "set -e\n${app_sh}")
run(app 0 ${WORK_DIR} bash ${WORK_DIR}/app.sh)
if(app MATCHES "(Caffe2|Torch|CUDA|MPI)[^\n]*")
  message(FATAL_ERROR "find_package(ddp) without components looked for ${CMAKE_MATCH_1}: '${CMAKE_MATCH_0}'")
endif()
file(STRINGS ${WORK_DIR}/app/build/CMakeCache.txt searched REGEX "^(Torch_DIR|Caffe2_DIR|CUDAToolkit_|MPI_|MPIEXEC)")
if(searched)
  message(FATAL_ERROR "find_package(ddp) without components looked for libtorch, CUDA or MPI; the app's cache has: ${searched}")
endif()
if(NOT app MATCHES "all_reduce over 2 ranks: 3 and 3; linear 784 -> 10 gave 2 x 10")
  message(FATAL_ERROR "the page's program did not print its result:\n${app}")
endif()
# The installed ddp-run starts the page's program on two processes (it ends, each time, as it
# should: ddp-run reports the run finished).
if(with_mpi)
  run(launched 0 ${WORK_DIR} ${prefix}/bin/ddp-run -n 2 --launcher-args "--oversubscribe --bind-to none"
      -- ${WORK_DIR}/app/build/app)
  if(NOT launched MATCHES "ddp-run: finished on 2 ranks after 0 restart")
    message(FATAL_ERROR "the installed ddp-run did not run the page's program on 2 ranks:\n${launched}")
  endif()
endif()

# 3. Refusals, at configure time and before any dependency is looked for.
file(WRITE ${WORK_DIR}/probe/CMakeLists.txt
     "cmake_minimum_required(VERSION 3.25)\nproject(probe LANGUAGES NONE)\n"
     "find_package(ddp CONFIG REQUIRED COMPONENTS \${COMPONENT})\n")
run(refusal fail ${WORK_DIR} ${CMAKE_COMMAND} -S probe -B probe/unknown -DCOMPONENT=cudaa -DCMAKE_PREFIX_PATH=${prefix})
string(REGEX REPLACE "[ \n]+" " " refusal "${refusal}")  # CMake wraps the reason it prints
if(NOT refusal MATCHES "ddp::cudaa: ddp has no component 'cudaa' \\(its components: nn, data, runtime, mpi, mpi_runtime, cuda, nccl, torch\\)")
  message(FATAL_ERROR "an unknown component was not named:\n${refusal}")
endif()
if(EXISTS ${prefix}/lib/cmake/ddp/ddp-cuda-targets.cmake AND NOT EXISTS ${prefix}/lib/libddp_cuda_kernels.a)
  run(refusal fail ${WORK_DIR} ${CMAKE_COMMAND} -S probe -B probe/cuda -DCOMPONENT=cuda -DCMAKE_PREFIX_PATH=${prefix})
  string(REGEX REPLACE "[ \n]+" " " refusal "${refusal}")
  if(NOT refusal MATCHES "ddp::cuda: ddp's CUDA kernels \\([^)]*libddp_cuda_kernels.a\\) were not installed.*--target ddp_cuda_kernels")
    message(FATAL_ERROR "the cuda component of an installation without kernels was not refused by name:\n${refusal}")
  endif()
endif()

# 4. Everything that was built, with every component the package provides.
set(full ${WORK_DIR}/full)
run(ignored 0 ${WORK_DIR} ${CMAKE_COMMAND} --install ${DDP_BINARY_DIR} --prefix ${full})
run(consumer 0 ${WORK_DIR} ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/consumer
    -DCMAKE_PREFIX_PATH=${full} -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE})
file(STRINGS ${WORK_DIR}/consumer/CMakeCache.txt searched REGEX "^(Torch_DIR|Caffe2_DIR)")
if(searched)
  message(FATAL_ERROR "the consumer did not name the torch component, yet libtorch was looked for: ${searched}")
endif()
run(ignored 0 ${WORK_DIR} ${CMAKE_COMMAND} --build ${WORK_DIR}/consumer --parallel 2)
run(ignored 0 ${WORK_DIR} ${WORK_DIR}/consumer/consumer)
