# strata_add_plugin(NAME SOURCES file... [OUTPUT_DIRECTORY dir])
#
# Builds strata_plugin_NAME.so, the file name the loader looks for, as a module that links
# Strata's core and libtorch (C++20, position-independent). Symbols are hidden except the entry
# point that STRATA_PLUGIN(...) defines; that macro stamps the descriptor with the plugin ABI,
# libtorch and C++ ABI versions this build sees, which the loader checks before anything else.
# Undefined symbols fail the link instead of the load.
#
# It links the plugin ABI (strata_plugin inside the Strata tree, Strata::plugin from
# find_package(Strata) elsewhere): plugin_api's headers and libstrata_core's symbols, never core's
# own headers, so a plugin can only reach what the versioned contract holds. Inside the tree it
# also reuses the libtorch precompiled header and installs bundled plugins (those without
# OUTPUT_DIRECTORY) next to the core library.
function(strata_add_plugin name)
  cmake_parse_arguments(ARG "" "OUTPUT_DIRECTORY" "SOURCES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "strata_add_plugin(${name}): no SOURCES")
  endif()
  set(target strata_plugin_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  if(TARGET strata_core)
    target_link_libraries(${target} PRIVATE strata_plugin)
    strata_use_torch_pch(${target})
    if(NOT ARG_OUTPUT_DIRECTORY)
      install(TARGETS ${target} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/strata/plugins)
      set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/../..")
      # A bundled plugin: part of what `strata` needs to train (the strata_main target).
      set_property(GLOBAL APPEND PROPERTY STRATA_BUNDLED_PLUGINS ${target})
    endif()
  else()
    target_link_libraries(${target} PRIVATE Strata::plugin)
  endif()
  if(NOT ARG_OUTPUT_DIRECTORY)
    if(DEFINED STRATA_PLUGIN_OUTPUT_DIR)
      set(ARG_OUTPUT_DIRECTORY ${STRATA_PLUGIN_OUTPUT_DIR})
    else()
      set(ARG_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
    endif()
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    OUTPUT_NAME strata_plugin_${name}
    POSITION_INDEPENDENT_CODE ON
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIRECTORY})
  target_link_options(${target} PRIVATE -Wl,--no-undefined)
endfunction()
