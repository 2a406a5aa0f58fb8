// Hugging Face `tokenizers` for the commands that tokenize (strata data prepare, strata sample on
// prepared token files): the library lives in Python, so these run the helper scripts installed
// in share/strata (launcher/data/) with a Python that has it.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace strata::cli {

// STRATA_PYTHON, else the venv scripts/setup makes (STRATA_VENV or ~/.local/share/strata/venv),
// else python3: the first that imports tokenizers and numpy. UserError naming how to get one.
std::string tokenizers_python(const std::string& command);

// A helper script beside the executable: bin/../share/strata/NAME, as installed and as the build
// tree mirrors it.
std::filesystem::path helper_script(const std::string& name);

// Runs `python helper args...`; its standard output. UserError with its last line when it fails.
std::string run_helper(const std::string& python, const std::string& helper, const std::vector<std::string>& args);

}  // namespace strata::cli
