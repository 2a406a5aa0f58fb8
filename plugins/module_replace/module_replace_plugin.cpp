// module_replace: chooses which implementation serves each operator, per strategy and per block,
// without touching the model or rebuilding (ATorch's module replacement, on Strata's operator
// table). Each choice becomes an operator pin (ops::pin): one key per core operator for every
// block, and `rules` for block selectors and operators that plugins define. Unknown operators or
// implementations, and implementations that do not support the job's device or compute dtype,
// are refused by `strata plan`; a selector that names no block is refused when the job starts.
#include <algorithm>
#include <iostream>
#include <sstream>

#include "strata/plugin.h"

namespace strata::module_replace {
namespace {

// The operators core defines (ops.h), one strategy key each.
const std::vector<std::string>& core_operators() {
  static const std::vector<std::string> names = {ops::Attention::name, ops::AttentionBackward::name, ops::LayerNorm::name, ops::RmsNorm::name, ops::AddLayerNorm::name, ops::AddRmsNorm::name,
                                                 ops::Linear::name,    ops::Gelu::name,      ops::SwiGlu::name,
                                                 ops::Rope::name,      ops::CrossEntropy::name, ops::LinearCrossEntropy::name,
                                                 ops::AgdUpdate::name, ops::AdamwUpdate::name};
  return names;
}

// One pin: operator `op` served by implementation `impl` (as written) in `blocks` (empty: all).
struct Choice {
  std::string op, impl;
  std::vector<std::string> blocks;
  std::string source;  // how the strategy wrote it, for messages
};

std::string trim(const std::string& s) {
  const size_t first = s.find_first_not_of(" \t"), last = s.find_last_not_of(" \t");
  return first == std::string::npos ? std::string() : s.substr(first, last - first + 1);
}

// "OP=IMPL" or "OP@SELECTOR,SELECTOR=IMPL"; nullopt when malformed.
std::optional<Choice> parse_rule(const std::string& rule) {
  const size_t eq = rule.find('=');
  if (eq == std::string::npos) return std::nullopt;
  Choice c;
  c.source = "rules entry \"" + rule + "\"";
  c.impl = trim(rule.substr(eq + 1));
  std::string left = trim(rule.substr(0, eq));
  if (const size_t at = left.find('@'); at != std::string::npos) {
    std::stringstream selectors(left.substr(at + 1));
    for (std::string s; std::getline(selectors, s, ',');) {
      if (trim(s).empty()) return std::nullopt;
      c.blocks.push_back(trim(s));
    }
    if (c.blocks.empty()) return std::nullopt;
    left = trim(left.substr(0, at));
  }
  c.op = left;
  if (c.op.empty() || c.impl.empty()) return std::nullopt;
  return c;
}

// Every choice of a validated config, in the order they are pinned: the per-operator keys (every
// block), then the rules, so a rule for some blocks overrides a key (the newest pin wins).
std::vector<Choice> choices(const Config& config) {
  std::vector<Choice> out;
  for (const auto& op : core_operators())
    if (const std::string& impl = config.get_string(op); !impl.empty()) out.push_back({op, impl, {}, op + " = \"" + impl + "\""});
  for (const auto& rule : config.get_strings("rules"))
    if (auto c = parse_rule(rule)) out.push_back(*c);
  return out;
}

// The implementation a choice names: written in full ("attention.fused_cpu") or without the
// operator's prefix ("fused_cpu"). Null when there is none; `problem` then says why.
const ops::OperatorImplBase* find_implementation(const Choice& c, std::string& problem) {
  std::vector<const ops::OperatorImplBase*> impls;
  try {
    impls = ops::implementations(c.op);
  } catch (const UserError&) {
    std::string known;
    for (const auto& name : ops::operator_names()) known += (known.empty() ? "" : ", ") + name;
    problem = "unknown operator '" + c.op + "' (operators: " + known + ")";
    return nullptr;
  }
  for (const auto* impl : impls)
    if (impl->name() == c.impl || impl->name() == c.op + "." + c.impl) return impl;
  std::string known;
  for (const auto* impl : impls) known += (known.empty() ? "" : ", ") + impl->name();
  problem = "operator '" + c.op + "' has no implementation '" + c.impl + "' (implementations: " + known + ")";
  return nullptr;
}

std::string blocks_text(const std::vector<std::string>& blocks) {
  if (blocks.empty()) return "every block";
  std::string s;
  for (const auto& b : blocks) s += (s.empty() ? "" : ", ") + b;
  return "blocks " + s;
}

// Whether two choices name a block in common (as far as plan can tell: both every block, or a
// selector written the same).
bool overlap(const Choice& a, const Choice& b) {
  if (a.blocks.empty() || b.blocks.empty()) return true;
  for (const auto& s : a.blocks)
    if (std::find(b.blocks.begin(), b.blocks.end(), s) != b.blocks.end()) return true;
  return false;
}

// The residual-norm operators (ops.h) and their norms. A fused implementation of one runs its
// norm's fused kernels and serves only where the norm is not the reference (the kernels check
// per call), so pinning both ways at once would leave the fused choice unserved: refused.
std::string composite_problem(const std::vector<Choice>& chosen) {
  static const std::vector<std::pair<std::string, std::string>> composites = {{ops::AddLayerNorm::name, ops::LayerNorm::name},
                                                                             {ops::AddRmsNorm::name, ops::RmsNorm::name}};
  for (const auto& [composite, norm] : composites)
    for (const auto& c : chosen) {
      std::string problem;
      const ops::OperatorImplBase* fused = c.op == composite ? find_implementation(c, problem) : nullptr;
      if (!fused || fused->name() == composite + ".reference") continue;
      // The newest norm choice in c's blocks is the one that holds there (the newest pin wins).
      for (auto n = chosen.rbegin(); n != chosen.rend(); ++n) {
        if (n->op != norm || !overlap(c, *n)) continue;
        const ops::OperatorImplBase* pinned = find_implementation(*n, problem);
        if (pinned && pinned->name() == norm + ".reference")
          return "pass 'module_replace' " + c.source + ": implementation '" + fused->name() + "' fuses the add into " + norm +
                 "'s fused kernels, but " + n->source + " pins the reference norm in " + blocks_text(n->blocks) +
                 ", so it would not serve there (choose " + composite + " = \"reference\" with that norm)";
        break;
      }
    }
  return {};
}

class ModuleReplacePass final : public Pass {
 public:
  ModuleReplacePass() : Pass({ComponentKind::Pass, "module_replace", "Choose operator implementations per strategy and per block", schema()},
                             {Phase::ModelRewrite, {}, {}, {}, {}}) {}

  void validate(const Config& config, const SourcePos& section, Diagnostics& diagnostics) const override {
    for (const auto& rule : config.get_strings("rules"))
      if (!parse_rule(rule))
        diagnostics.error(config.entry("rules").pos.file.empty() ? section : config.entry("rules").pos,
                          "pass 'module_replace' rules entry \"" + rule + "\" is not OP=IMPL or OP@BLOCK,BLOCK=IMPL");
  }

  std::string plan_problem(const Config& config, const PlanFacts& facts) const override {
    for (const auto& c : choices(config)) {
      std::string problem;
      const ops::OperatorImplBase* impl = find_implementation(c, problem);
      if (!impl) return "pass 'module_replace' " + c.source + ": " + problem;
      if (!impl->support().accepts(facts.device, facts.compute_dtype))
        return "pass 'module_replace' " + c.source + ": implementation '" + impl->name() + "' supports " + impl->support().str() +
               ", but the blocks compute on " + c10::DeviceTypeName(facts.device, true) + " in " + c10::toString(facts.compute_dtype) +
               (facts.compute_dtype_by.empty() ? std::string() : " (pass '" + facts.compute_dtype_by + "')");
    }
    return composite_problem(choices(config));
  }

  std::string describe_plan(const Config& config, const PlanFacts& facts) const override {
    std::ostringstream out;
    out << "Operator implementations (module_replace; the blocks compute on " << c10::DeviceTypeName(facts.device, true) << " in "
        << c10::toString(facts.compute_dtype) << "):\n";
    const std::vector<Choice> chosen = choices(config);
    for (const auto& op : ops::operator_names()) {
      std::string by_priority;
      for (const auto* impl : ops::implementations(op))
        if (impl->support().accepts(facts.device, facts.compute_dtype)) {
          by_priority = impl->name();
          break;
        }
      // Newest choice first, as selection reads the pins.
      std::vector<std::string> lines;
      bool everywhere = false;
      for (auto c = chosen.rbegin(); c != chosen.rend() && !everywhere; ++c) {
        if (c->op != op) continue;
        std::string problem;
        const ops::OperatorImplBase* impl = find_implementation(*c, problem);
        lines.push_back((impl ? impl->name() : c->impl) + " in " + blocks_text(c->blocks) + " (chosen)");
        everywhere = c->blocks.empty();
      }
      if (!everywhere) lines.push_back(by_priority + (lines.empty() ? " in every block" : " elsewhere") + " (by priority)");
      out << "  " << op << ": ";
      for (size_t i = 0; i < lines.size(); ++i) out << (i ? "; " : "") << lines[i];
      out << "\n";
    }
    return out.str();
  }

  void apply(Job& job, const Config& config) const override {
    const bool report = !job.topology || job.topology->rank() == 0;
    for (const auto& c : choices(config)) {
      std::string problem;
      const ops::OperatorImplBase* impl = find_implementation(c, problem);
      if (!impl) throw UserError("pass 'module_replace' " + c.source + ": " + problem);
      std::vector<std::string> served;
      // A pipeline rank holds its stages' blocks only: a choice is refused when no rank's blocks
      // match, and rank 0 names the selectors rather than the blocks it holds.
      const bool staged = job.topology && job.topology->size(Dim::Pipeline) > 1;
      if (!c.blocks.empty()) {
        const std::vector<size_t> found = job.model->find_blocks(c.blocks);
        if (!found_on_any_rank(job, !found.empty()))
          throw UserError("pass 'module_replace' " + c.source + ": no block of the model is named or typed " + blocks_text(c.blocks).substr(7) +
                          (staged ? " (`strata plan` lists each pipeline stage's blocks)" : " (blocks: " + block_list(*job.model) + ")"));
        for (size_t b : found) served.push_back(job.model->block_name(b));
        if (staged) served = c.blocks;
      }
      ops::pin(c.op, impl->name(), c.blocks);
      if (report) std::cout << "module_replace: " << impl->name() << " serves " << c.op << " in " << blocks_text(served) << "\n";
    }
  }

 private:
  static Schema schema() {
    Schema s;
    for (const auto& op : core_operators())
      s.string(op, "",
               "Implementation of " + op + " in every block (a name from `strata ops`, with or without the '" + op +
                   ".' prefix); empty = the highest priority that supports the call");
    s.strings("rules", {},
              "More choices, applied after the keys above (the last that matches a block wins): \"OP=IMPL\" or "
              "\"OP@SELECTOR,...=IMPL\", selectors being block names or types (\"attention@h.0,h.1=reference\"); OP may be an "
              "operator a plugin defines");
    return s;
  }

  static std::string block_list(const nn::Model& model) {
    std::string s;
    for (size_t i = 0; i < model.num_blocks(); ++i) s += (i ? ", " : "") + model.block_name(i);
    return s;
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<ModuleReplacePass>()); }

}  // namespace
}  // namespace strata::module_replace

STRATA_PLUGIN("module_replace", "0.1.0", strata::module_replace::register_components)
