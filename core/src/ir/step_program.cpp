#include "strata/step_program.h"

#include <stdexcept>

namespace strata {

StepProgram::Slot& StepProgram::slot(Stage stage) { return slots_[stage]; }

void StepProgram::provide(Stage stage, std::string description, StageFn fn) {
  Slot& s = slot(stage);
  s.provider = "core: " + description;
  s.fn = std::move(fn);
}

void StepProgram::require_claim(Stage stage, StageUse use) const {
  if (applying_.empty())
    throw std::logic_error(std::string("stage '") + stage_name(stage) + "' changed outside a pass's apply()");
  for (const auto& c : applying_claims_.stages)
    if (c.stage == stage && c.use == use) return;
  throw std::logic_error("pass '" + applying_ + "' " + (use == StageUse::Own ? "owns" : "wraps") + " stage '" +
                         stage_name(stage) + "' without declaring it in its Claims (strata plan could not show it)");
}

void StepProgram::own(Stage stage, StageFn fn) {
  require_claim(stage, StageUse::Own);
  Slot& s = slot(stage);
  // Plan time refuses two owners; this guards passes loaded around the plan check.
  if (!s.provider.empty() && s.provider.rfind("core: ", 0) != 0)
    throw std::logic_error(std::string("stage '") + stage_name(stage) + "' is owned by pass '" + s.provider +
                           "' and by pass '" + applying_ + "'");
  s.provider = applying_;
  s.fn = std::move(fn);
}

void StepProgram::wrap(Stage stage, StageWrapper wrapper) {
  require_claim(stage, StageUse::Wrap);
  Slot& s = slot(stage);
  s.wrappers.push_back(applying_);
  s.wrapper_fns.push_back(std::move(wrapper));
}

// Wrappers compose at run time, so an owner applied after a wrapper is still wrapped by it.
void StepProgram::run_layer(const Slot& s, size_t layers, StepContext& context) const {
  if (layers == 0) return s.fn(context);
  s.wrapper_fns[layers - 1](context, [&](StepContext& c) { run_layer(s, layers - 1, c); });
}

void StepProgram::run(Stage stage, StepContext& context) const {
  auto it = slots_.find(stage);
  if (it == slots_.end() || !it->second.fn) throw std::logic_error(std::string("stage '") + stage_name(stage) + "' has no implementation");
  run_layer(it->second, it->second.wrapper_fns.size(), context);
}

std::string StepProgram::provider(Stage stage) const {
  auto it = slots_.find(stage);
  return it == slots_.end() ? std::string() : it->second.provider;
}

std::vector<std::string> StepProgram::wrappers(Stage stage) const {
  auto it = slots_.find(stage);
  return it == slots_.end() ? std::vector<std::string>{} : it->second.wrappers;
}

void StepProgram::begin_pass(std::string name, Claims claims) {
  applying_ = std::move(name);
  applying_claims_ = std::move(claims);
}

void StepProgram::end_pass() {
  applying_.clear();
  applying_claims_ = {};
}

}  // namespace strata
