# ccache in front of the compiler; the sloppiness settings let it cache translation units that
# use the libtorch precompiled header.
find_program(STRATA_CCACHE ccache)
if(STRATA_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      ${STRATA_CCACHE})
  message(STATUS "Strata: compiling through ccache (${STRATA_CCACHE})")
endif()
