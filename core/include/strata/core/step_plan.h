// The step program as `strata plan` shows it and as the trainer runs it: core's description of
// each stage, and the composition that the enabled passes' declared claims produce.
#pragma once

#include <string>
#include <vector>

#include "strata/core/strategy.h"
#include "strata/step_program.h"

namespace strata {

// What core's own implementation of a stage does, in one line.
STRATA_API const char* core_stage_description(Stage stage);

// The program the passes of `order` compose, built from their declared claims alone (stage
// functions are empty): what `strata plan` prints before anything runs.
STRATA_API StepProgram planned_step_program(const ResolvedStrategy& plan, const std::vector<size_t>& order);

// Each stage with its provider and its wrappers, one per line, indented by `indent`.
STRATA_API std::string describe_step_program(const StepProgram& program, const std::string& indent = "  ");

}  // namespace strata
