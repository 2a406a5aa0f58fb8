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

namespace {

// The directories above `path`, nearest first, as the path names them (not resolved).
std::optional<std::string> check_directories_above(const std::filesystem::path& path) {
  bool immediate = true;
  for (std::filesystem::path dir = path.parent_path();; dir = dir.parent_path()) {
    if (auto why = check_one(dir, immediate, false)) return why;
    immediate = false;
    if (dir == dir.root_path() || dir.empty()) break;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> untrusted_reason(const std::filesystem::path& file) {
  std::error_code ec;
  // The path as found first: a symlink is only as trustworthy as the directory that holds it
  // (whoever can write that directory chooses where the link points), and the link itself.
  const std::filesystem::path found = std::filesystem::absolute(file, ec).lexically_normal();
  if (ec) return "cannot resolve " + file.string() + ": " + ec.message();
  struct stat link {};
  if (::lstat(found.c_str(), &link) != 0) return "cannot stat " + found.string();
  if (S_ISLNK(link.st_mode) && link.st_uid != 0 && link.st_uid != ::geteuid())
    return "symlink " + found.string() + " belongs to another user (uid " + std::to_string(link.st_uid) + ")";
  if (auto why = check_directories_above(found)) return why;
  // Then what it resolves to.
  const std::filesystem::path real = std::filesystem::canonical(file, ec);
  if (ec) return "cannot resolve " + file.string() + ": " + ec.message();
  if (auto why = check_one(real, false, true)) return why;
  return check_directories_above(real);
}

}  // namespace strata
