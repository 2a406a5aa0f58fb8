# Fails when docs/strategy-reference.md differs from what `strata docs` generates now.
execute_process(COMMAND ${STRATA} docs -o ${OUT} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "strata docs failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${OUT} ${REFERENCE} RESULT_VARIABLE differs)
if(differs)
  message(FATAL_ERROR "${REFERENCE} is out of date; regenerate it with: build/bin/strata docs -o docs/strategy-reference.md")
endif()
