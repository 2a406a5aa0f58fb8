#include "strata/component.h"
#include "strata/errors.h"
#include "strata/pass.h"
#include "strata/registry.h"

namespace strata {

UserError::UserError(const std::string& message) : std::runtime_error(message) {}
UserError::~UserError() = default;

const char* component_kind_name(ComponentKind kind) {
  switch (kind) {
    case ComponentKind::Pass: return "pass";
    case ComponentKind::Operator: return "operator";
    case ComponentKind::Optimizer: return "optimizer";
    case ComponentKind::Communicator: return "communicator";
    case ComponentKind::Model: return "model";
    case ComponentKind::Dataset: return "dataset";
    case ComponentKind::Schedule: return "schedule";
  }
  return "?";
}

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::Topology: return "topology";
    case Phase::ModelRewrite: return "model_rewrite";
    case Phase::Precision: return "precision";
    case Phase::Wrapping: return "wrapping";
    case Phase::Optimizer: return "optimizer";
    case Phase::Schedule: return "schedule";
    case Phase::Runtime: return "runtime";
  }
  return "?";
}

struct detail::ComponentState {
  ComponentInfo info;
};
Component::Component(ComponentInfo info) : state_(std::make_unique<detail::ComponentState>(detail::ComponentState{std::move(info)})) {}
Component::~Component() = default;
DerivesDefaults::~DerivesDefaults() = default;
LoadsHfModelTypes::~LoadsHfModelTypes() = default;
const ComponentInfo& Component::info() const { return state_->info; }
const std::string& Component::name() const { return state_->info.name; }
ComponentKind Component::kind() const { return state_->info.kind; }
void Component::validate(const Config&, const SourcePos&, Diagnostics&) const {}

namespace {
ComponentInfo as_pass(ComponentInfo info) {
  info.kind = ComponentKind::Pass;
  return info;
}
}  // namespace

struct detail::PassState {
  PassOrdering ordering;
  Claims claims;
};
Pass::Pass(ComponentInfo info, PassOrdering ordering, Claims claims)
    : Component(as_pass(std::move(info))), state_(std::make_unique<detail::PassState>(detail::PassState{std::move(ordering), std::move(claims)})) {}
Pass::~Pass() = default;
const PassOrdering& Pass::ordering() const { return state_->ordering; }
const Claims& Pass::claims() const { return state_->claims; }
std::string Pass::describe_plan(const Config&, const PlanFacts&) const { return {}; }

std::string Pass::size_problem(const Config&, const Config&, const MeshSizes&) const { return {}; }
std::optional<c10::ScalarType> Pass::compute_dtype(const Config&) const { return std::nullopt; }
std::string Pass::plan_problem(const Config&, const PlanFacts&) const { return {}; }
std::optional<std::vector<size_t>> Pass::blocks_to_build(const Config&, const Job&, const std::function<const nn::Model&()>&) const {
  return std::nullopt;
}
std::shared_ptr<nn::BuildKeeper> Pass::keeper_at_build(const Config&, const Job&, const std::function<const nn::Model&()>&) const {
  return nullptr;
}
TuneUse Pass::tune_use() const { return TuneUse::UserOnly; }
KeepsBuiltBlocks::~KeepsBuiltBlocks() = default;
void Pass::estimate(const Config&, const PlanFacts&, CostEstimate&) const {}

bool Pass::claims_stage(Stage stage, StageUse use) const {
  for (const auto& c : state_->claims.stages)
    if (c.stage == stage && c.use == use) return true;
  return false;
}

const char* stage_name(Stage stage) {
  switch (stage) {
    case Stage::PrepareBatches: return "prepare_batches";
    case Stage::Gradients: return "gradients";
    case Stage::ForwardBackward: return "forward_backward";
    case Stage::SyncGradients: return "sync_gradients";
    case Stage::ClipGradients: return "clip_gradients";
    case Stage::OptimizerStep: return "optimizer_step";
    case Stage::Evaluate: return "evaluate";
  }
  return "?";
}

Registry::~Registry() = default;

}  // namespace strata
