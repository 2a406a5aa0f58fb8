// For components whose declaration (name, keys, ordering) ships before their runtime does:
// applying them is a clear error, never a silent no-op.
#pragma once

#include <string>

#include "strata/errors.h"

namespace strata {

[[noreturn]] inline void fail_not_built(const std::string& what) {
  throw UserError(what + " is declared but its runtime is not part of this Strata build yet");
}

}  // namespace strata
