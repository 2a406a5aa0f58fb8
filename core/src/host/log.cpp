#include "strata/core/log.h"

#include <spdlog/sinks/basic_file_sink.h>
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

// The file sinks alone, for lines the console printed already.
spdlog::logger& file_logger() {
  static auto instance = [] {
    auto l = std::make_shared<spdlog::logger>("strata-file");
    l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] %v");
    return l;
  }();
  return *instance;
}

}  // namespace

namespace {
std::string& first_file_path() {
  static std::string path;
  return path;
}
}  // namespace

std::string first_file() { return first_file_path(); }

void add_file(const std::string& path) {
  if (first_file_path().empty()) first_file_path() = path;
  auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path);
  sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  logger().sinks().push_back(sink);
  file_logger().sinks().push_back(sink);
  logger().flush_on(spdlog::level::debug);
  file_logger().flush_on(spdlog::level::info);
}

void record(const std::string& line) { file_logger().info(line); }

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
