#include "python_tokenizers.h"

#include <cstdio>
#include <cstdlib>

#include "strata/errors.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

bool has_tokenizers(const std::string& python) {
  const std::string command = "'" + python + "' -c 'import tokenizers, numpy' > /dev/null 2>&1";
  return std::system(command.c_str()) == 0;
}

std::string quoted(const std::string& word) {
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string tokenizers_python(const std::string& command) {
  if (const char* chosen = std::getenv("STRATA_PYTHON"); chosen && *chosen) {
    if (!has_tokenizers(chosen))
      throw UserError(std::string("STRATA_PYTHON=") + chosen + " cannot import tokenizers and numpy (pip install tokenizers numpy)");
    return chosen;
  }
  const char* venv = std::getenv("STRATA_VENV");
  const char* home = std::getenv("HOME");
  const fs::path made = venv && *venv ? fs::path(venv) : fs::path(home ? home : "/") / ".local/share/strata/venv";
  if (fs::exists(made / "bin/python") && has_tokenizers((made / "bin/python").string())) return (made / "bin/python").string();
  if (has_tokenizers("python3")) return "python3";
  throw UserError(command + " needs Python with Hugging Face tokenizers: scripts/setup installs it into " + made.string() +
                  ", or set STRATA_PYTHON to a python that has it");
}

fs::path helper_script(const std::string& name) {
  const fs::path installed = fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "share" / "strata" / name;
  if (!fs::exists(installed)) throw UserError(installed.string() + " is missing (a broken install?)");
  return installed;
}

std::string run_helper(const std::string& python, const std::string& helper, const std::vector<std::string>& args) {
  std::string command = quoted(python) + " " + quoted(helper_script(helper).string());
  for (const auto& a : args) command += " " + quoted(a);
  command += " 2>&1";
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) throw UserError("cannot start " + python);
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) output.append(buf, n);
  if (pclose(pipe) != 0) {
    const size_t end = output.find_last_not_of('\n');
    const size_t begin = end == std::string::npos ? 0 : output.rfind('\n', end) + 1;
    throw UserError(helper + " failed: " + output.substr(begin, end == std::string::npos ? 0 : end - begin + 1));
  }
  return output;
}

}  // namespace strata::cli
