#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "strata/core/plugin_loader.h"

namespace strata {

namespace {

std::string octal_mode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

std::optional<std::string> check_one(const std::filesystem::path& path, bool is_immediate_dir, bool is_file) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "cannot stat " + path.string();
  if (st.st_uid != 0 && st.st_uid != ::geteuid())
    return path.string() + " belongs to another user (uid " + std::to_string(st.st_uid) + ")";
  bool writable_by_others = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
  if (!writable_by_others) return std::nullopt;
  bool sticky_ancestor = !is_file && !is_immediate_dir && (st.st_mode & S_ISVTX);
  if (sticky_ancestor) return std::nullopt;
  return std::string(is_file ? "file " : "directory ") + path.string() + " is writable by other users (mode " +
         octal_mode(st.st_mode) + "); run 'chmod go-w " + path.string() + "'";
}

}  // namespace

std::optional<std::string> untrusted_reason(const std::filesystem::path& file) {
  std::error_code ec;
  std::filesystem::path real = std::filesystem::canonical(file, ec);
  if (ec) return "cannot resolve " + file.string() + ": " + ec.message();
  if (auto why = check_one(real, false, true)) return why;
  bool immediate = true;
  for (std::filesystem::path dir = real.parent_path();; dir = dir.parent_path()) {
    if (auto why = check_one(dir, immediate, false)) return why;
    immediate = false;
    if (dir == dir.root_path()) break;
  }
  return std::nullopt;
}

}  // namespace strata
