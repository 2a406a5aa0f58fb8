// Logging. spdlog does the work behind this narrow interface because libtorch bundles its own,
// newer {fmt}, which Debian's spdlog cannot compile against: only core/src/host/log.cpp sees spdlog,
// and it is built without libtorch's include directories.
#pragma once

#include <string>

#include "strata/export.h"

namespace strata::log {

enum class Level { Debug, Info, Warn, Error };

STRATA_API void set_level(Level level);
STRATA_API void debug(const std::string& message);
STRATA_API void info(const std::string& message);
STRATA_API void warn(const std::string& message);
STRATA_API void error(const std::string& message);

// Also writes every message, with a timestamp, to `path` (appending); used for the run's
// logs/rank_N.log.
STRATA_API void add_file(const std::string& path);
// The first file add_file named (the run's logs/rank_N.log), or empty before any.
STRATA_API std::string first_file();
// Writes `line` to the log files only: for what the console already shows on standard output.
STRATA_API void record(const std::string& line);

}  // namespace strata::log
