# The test suites of several files, and ddp-bench's trainer subcommands, compile as unity units:
# the files of a unit instantiate the same trainer types (one model over the in-process
# communicator), which a unit compiles once. The trainer suite's 13 files take about 330 s of
# compiler time one by one and 158 s as two units (docs/testing.md). Each file keeps its names in
# a namespace named after it, so the files of a unit do not collide. DDP_UNITY_BUILD=OFF compiles
# every file on its own: an edit then recompiles that file, not its unit.
option(DDP_UNITY_BUILD "Compile multi-file test suites and ddp-bench's subcommands as unity units" ON)

# ddp_unity_units(target units files...): the target's unity sources compiled as `units` units, in
# the order the target lists them (files marked SKIP_UNITY_BUILD_INCLUSION stay on their own).
function(ddp_unity_units target units)
  if(NOT DDP_UNITY_BUILD)
    return()
  endif()
  list(LENGTH ARGN files)
  math(EXPR batch "(${files} + ${units} - 1) / ${units}")
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${batch})
endfunction()
