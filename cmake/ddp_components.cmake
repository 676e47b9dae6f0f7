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
