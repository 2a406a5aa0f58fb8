# strata_add_gtest_suites(TARGET [PREFIX prefix] [LABELS label...]): one CTest test per GoogleTest
# suite of TARGET, its cases run in one process (--gtest_filter=Suite.*), where gtest_discover_tests
# would register one process per case.
#
# Why: every process pays libtorch's start-up, about 0.3 s of operator registration on the 2-core CI
# machine; run one per case, the ~290 unit, kernel, MoE, fp8 and GPU cases spent ~90 s of the
# suite's 25-minute budget starting up. A failing suite's output names the failing case.
#
# The suites are read from TARGET's *_test.cpp sources at configure time (TEST, TEST_F, TEST_P,
# TYPED_TEST at the start of a line; a source's edit re-runs the configuration, so a new suite is
# registered). Value-parameterised cases ("Prefix/Suite.Case/Param") and typed ones ("Suite/0.Case")
# are matched too. A suite whose every case skipped (GTEST_SKIP, as the GPU tests do without a
# device) is reported as skipped, through run_gtest_suite.sh's exit status; one with a failure
# fails, whatever else it skipped.
set(STRATA_GTEST_SUITES_DIR ${CMAKE_CURRENT_LIST_DIR})
function(strata_add_gtest_suites target)
  cmake_parse_arguments(arg "" "PREFIX" "LABELS" ${ARGN})
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  set(suites)
  foreach(source IN LISTS sources)
    if(NOT source MATCHES "_test\\.cpp$")
      continue()
    endif()
    cmake_path(ABSOLUTE_PATH source BASE_DIRECTORY ${source_dir})
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${source})
    file(STRINGS ${source} lines REGEX "^(TEST|TEST_F|TEST_P|TYPED_TEST|TYPED_TEST_P)\\([A-Za-z0-9_]+,")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^[A-Z_]+\\(([A-Za-z0-9_]+),.*" "\\1" suite "${line}")
      list(APPEND suites ${suite})
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES suites)
  if(NOT suites)
    message(FATAL_ERROR "strata_add_gtest_suites: no GoogleTest suite found in ${target}'s sources")
  endif()
  foreach(suite IN LISTS suites)
    set(name ${arg_PREFIX}${suite})
    add_test(NAME ${name} COMMAND ${STRATA_GTEST_SUITES_DIR}/run_gtest_suite.sh $<TARGET_FILE:${target}>
      --gtest_filter=${suite}.*:*/${suite}.*:${suite}/*)
    set_tests_properties(${name} PROPERTIES LABELS "${arg_LABELS}" SKIP_RETURN_CODE 77)
  endforeach()
endfunction()
