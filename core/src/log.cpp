#include "strata/core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace strata::log {

namespace {

// Logs go to stderr so that stdout carries only a command's results (plans, JSON).
spdlog::logger& logger() {
  static auto instance = [] {
    auto l = spdlog::stderr_color_mt("strata");
    l->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    l->set_level(spdlog::level::info);
    return l;
  }();
  return *instance;
}

}  // namespace

void set_level(Level level) {
  static constexpr spdlog::level::level_enum levels[] = {spdlog::level::debug, spdlog::level::info,
                                                         spdlog::level::warn, spdlog::level::err};
  logger().set_level(levels[static_cast<int>(level)]);
}

void debug(const std::string& message) { logger().debug(message); }
void info(const std::string& message) { logger().info(message); }
void warn(const std::string& message) { logger().warn(message); }
void error(const std::string& message) { logger().error(message); }

}  // namespace strata::log
