cmake_minimum_required(VERSION 3.25)
# The layers of include/ddp, as docs/design.md draws them: floors, lowest first. A folder may
# include any folder on a floor below its own; none on its own floor (its siblings) and none
# above. Fails naming the header and the include that breaks it.
#   cmake -DDDP_INCLUDE_DIR=include/ddp -P tests/layering/check.cmake
set(floors
  "core"
  "concepts optim"
  "comm"
  "host cuda"
  "inproc mpi nccl nn torch"
  "data policy"
  "sampler"
  "trainer"
  "runtime")

# floor_<folder>: its floor's number; below_<folder>: every folder on a lower floor.
set(below "")
set(number 0)
foreach(floor IN LISTS floors)
  string(REPLACE " " ";" siblings "${floor}")
  foreach(folder IN LISTS siblings)
    if(DEFINED floor_${folder})
      message(FATAL_ERROR "ddp: ${folder}/ stands on two floors of tests/layering/check.cmake")
    endif()
    set(floor_${folder} ${number})
    set(below_${folder} ${below})
  endforeach()
  list(APPEND below ${siblings})
  math(EXPR number "${number} + 1")
endforeach()

# GLOB RELATIVE finds nothing under a relative path: make it absolute, and find something.
get_filename_component(DDP_INCLUDE_DIR "${DDP_INCLUDE_DIR}" ABSOLUTE)
file(GLOB folders RELATIVE ${DDP_INCLUDE_DIR} ${DDP_INCLUDE_DIR}/*)
if(NOT folders)
  message(FATAL_ERROR "ddp: no folders under DDP_INCLUDE_DIR=${DDP_INCLUDE_DIR}: pass include/ddp")
endif()
set(problems "")
foreach(folder IN LISTS folders)
  if(NOT IS_DIRECTORY ${DDP_INCLUDE_DIR}/${folder})
    continue()
  endif()
  if(NOT DEFINED floor_${folder})
    string(APPEND problems "\n  include/ddp/${folder}/ is a folder with no place in the layers: add it to tests/layering/check.cmake and docs/design.md")
    continue()
  endif()
  file(GLOB_RECURSE headers ${DDP_INCLUDE_DIR}/${folder}/*.hpp ${DDP_INCLUDE_DIR}/${folder}/*.cuh)
  foreach(header IN LISTS headers)
    file(STRINGS ${header} includes REGEX "^#include [\"<]ddp/[a-z_]+/")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^#include [\"<]ddp/([a-z_]+)/.*" "\\1" target "${line}")
      if(NOT target STREQUAL folder AND NOT target IN_LIST below_${folder})
        file(RELATIVE_PATH name ${DDP_INCLUDE_DIR} ${header})
        string(REPLACE ";" ", " may "${below_${folder}}")
        if(NOT may)
          set(may "no other folder")
        endif()
        string(APPEND problems "\n  ddp/${name}: ${line} (ddp/${folder}/ may include only: ${may})")
      endif()
    endforeach()
  endforeach()
endforeach()
if(problems)
  message(FATAL_ERROR "ddp: includes that break the layering of docs/design.md:${problems}")
endif()
message(STATUS "ddp: the include layers hold")
