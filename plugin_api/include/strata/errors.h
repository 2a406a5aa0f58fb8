// Errors shared by core and plugins.
#pragma once

#include <stdexcept>
#include <string>

#include "strata/export.h"

namespace strata {

// Bad input from the user (strategy, command line, plugin files). The launcher prints the
// message as one line and exits with status 2. Messages name the culprit and what to do.
class STRATA_API UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message);
  ~UserError() override;
};

}  // namespace strata
