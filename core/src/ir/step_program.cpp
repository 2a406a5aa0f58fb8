#include "strata/step_program.h"

#include <stdexcept>
#include <utility>

#include <ATen/ATen.h>

#include "device_loss_scale.h"

namespace strata {

namespace {
struct Slot {
  std::string provider;
  StageFn fn;
  std::vector<std::string> wrappers;
  std::vector<StageWrapper> wrapper_fns;
};

// Wrappers compose at run time, so an owner applied after a wrapper is still wrapped by it.
void run_layer(const Slot& s, size_t layers, StepContext& context) {
  if (layers == 0) return s.fn(context);
  s.wrapper_fns[layers - 1](context, [&](StepContext& c) { run_layer(s, layers - 1, c); });
}
}  // namespace

struct detail::StepProgramState {
  std::map<Stage, Slot> slots;
  std::string applying;
  Claims applying_claims;
  std::vector<std::pair<std::string, at::Tensor>> device_figures;  // of the step running
  at::Tensor device_loss_scale;
  std::vector<at::Tensor> skip_flags;

  Slot& slot(Stage stage) { return slots[stage]; }
  void require_claim(Stage stage, StageUse use) const;
};

StepProgram::StepProgram() : state_(std::make_unique<detail::StepProgramState>()) {}
StepProgram::~StepProgram() {
  if (state_ && state_->device_loss_scale.defined()) nn::forget_device_loss_scale(state_->device_loss_scale);
}
StepProgram::StepProgram(StepProgram&&) noexcept = default;
StepProgram& StepProgram::operator=(StepProgram&&) noexcept = default;

void StepProgram::provide(Stage stage, std::string description, StageFn fn) {
  Slot& s = state_->slot(stage);
  s.provider = "core: " + description;
  s.fn = std::move(fn);
}

void detail::StepProgramState::require_claim(Stage stage, StageUse use) const {
  if (applying.empty())
    throw std::logic_error(std::string("stage '") + stage_name(stage) + "' changed outside a pass's apply()");
  for (const auto& c : applying_claims.stages)
    if (c.stage == stage && c.use == use) return;
  throw std::logic_error("pass '" + applying + "' " + (use == StageUse::Own ? "owns" : "wraps") + " stage '" +
                         stage_name(stage) + "' without declaring it in its Claims (strata plan could not show it)");
}

void StepProgram::own(Stage stage, StageFn fn) {
  state_->require_claim(stage, StageUse::Own);
  Slot& s = state_->slot(stage);
  // Plan time refuses two owners; this guards passes loaded around the plan check.
  if (!s.provider.empty() && s.provider.rfind("core: ", 0) != 0)
    throw std::logic_error(std::string("stage '") + stage_name(stage) + "' is owned by pass '" + s.provider +
                           "' and by pass '" + state_->applying + "'");
  s.provider = state_->applying;
  s.fn = std::move(fn);
}

void StepProgram::wrap(Stage stage, StageWrapper wrapper) {
  state_->require_claim(stage, StageUse::Wrap);
  Slot& s = state_->slot(stage);
  s.wrappers.push_back(state_->applying);
  s.wrapper_fns.push_back(std::move(wrapper));
}

void StepProgram::run(Stage stage, StepContext& context) const {
  auto it = state_->slots.find(stage);
  if (it == state_->slots.end() || !it->second.fn) throw std::logic_error(std::string("stage '") + stage_name(stage) + "' has no implementation");
  run_layer(it->second, it->second.wrapper_fns.size(), context);
}

std::string StepProgram::provider(Stage stage) const {
  auto it = state_->slots.find(stage);
  return it == state_->slots.end() ? std::string() : it->second.provider;
}

std::vector<std::string> StepProgram::wrappers(Stage stage) const {
  auto it = state_->slots.find(stage);
  return it == state_->slots.end() ? std::vector<std::string>{} : it->second.wrappers;
}

void StepProgram::report_device_figure(std::string name, at::Tensor value) {
  if (!value.defined() || value.numel() != 1)
    throw std::logic_error("report_device_figure('" + name + "'): the figure must be a tensor of one element");
  state_->device_figures.emplace_back(std::move(name), value.detach().reshape({}));
}

std::vector<std::pair<std::string, at::Tensor>> StepProgram::take_device_figures() { return std::exchange(state_->device_figures, {}); }

void StepProgram::set_device_loss_scale(at::Tensor scale) {
  if (!scale.defined() || scale.numel() != 1 || !at::isFloatingType(scale.scalar_type()))
    throw std::logic_error("set_device_loss_scale: the scale must be a floating-point tensor of one element");
  state_->device_loss_scale = scale.detach().reshape({});
  nn::set_device_loss_scale(state_->device_loss_scale);  // auxiliary losses' backward multiplies it in
}

at::Tensor StepProgram::device_loss_scale() const { return state_->device_loss_scale; }

void StepProgram::add_skip_flag(at::Tensor flag) {
  if (!flag.defined() || flag.numel() != 1) throw std::logic_error("add_skip_flag: the flag must be a tensor of one element");
  state_->skip_flags.push_back(flag.detach().reshape({}));
}

at::Tensor StepProgram::skip_flag() const {
  const auto& flags = state_->skip_flags;
  if (flags.size() <= 1) return flags.empty() ? at::Tensor() : flags.front();
  at::Tensor any = flags.front().ne(0);
  for (size_t i = 1; i < flags.size(); ++i) any = any.logical_or(flags[i].ne(0));
  return any.to(at::kFloat);
}

void StepProgram::begin_pass(std::string name, Claims claims) {
  state_->applying = std::move(name);
  state_->applying_claims = std::move(claims);
}

void StepProgram::end_pass() {
  state_->applying.clear();
  state_->applying_claims = {};
}

}  // namespace strata
