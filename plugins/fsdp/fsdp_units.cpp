#include "fsdp_units.h"

#include <algorithm>
#include <optional>

#include <c10/util/accumulate.h>

namespace strata::fsdp {

namespace {

std::vector<BlockInfo> describe_blocks(const nn::Model& model) {
  std::vector<BlockInfo> out;
  for (size_t b = 0; b < model.num_blocks(); ++b) {
    BlockInfo info{model.block_name(b), model.block(b).type(), {}};
    for (const auto& p : nn::block_parameter_shapes(model, b))
      if (p.trains) info.params.emplace_back(info.name + "." + p.name, c10::multiply_integers(p.shape));
    out.push_back(std::move(info));
  }
  return out;
}

std::vector<BlockRun> wrapped_runs(const nn::Model& model, const std::vector<BlockInfo>& blocks, const Config& config,
                                   const std::vector<size_t>& ignored) {
  auto is_ignored = [&](size_t b) { return std::find(ignored.begin(), ignored.end(), b) != ignored.end(); };
  std::vector<bool> taken(blocks.size(), false);
  std::vector<BlockRun> runs;
  for (size_t b : model.find_blocks(config.get_strings("wrap")))
    if (!is_ignored(b)) runs.push_back({b, b}), taken[b] = true;
  if (const int64_t min_params = config.get_int("min_params"); min_params > 0) {
    std::optional<size_t> start;
    int64_t count = 0;
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (taken[b] || is_ignored(b)) {
        start.reset(), count = 0;
        continue;
      }
      if (!start) start = b;
      for (const auto& p : blocks[b].params) count += p.second;
      if (count >= min_params) runs.push_back({*start, b}), start.reset(), count = 0;
    }
  }
  std::sort(runs.begin(), runs.end(), [](const BlockRun& a, const BlockRun& b) { return a.first < b.first; });
  return runs;
}

}  // namespace

UnitPlan plan_units(const nn::Model& model, const Config& config) {
  UnitPlan plan;
  plan.blocks = describe_blocks(model);
  const std::vector<BlockInfo>& blocks = plan.blocks;
  const std::vector<std::string>& shared = model.shared_parameters();
  const std::vector<size_t> ignored_blocks = model.find_blocks(config.get_strings("ignored"));
  plan.runs = wrapped_runs(model, blocks, config, ignored_blocks);
  auto is_shared = [&](const std::string& n) { return std::find(shared.begin(), shared.end(), n) != shared.end(); };
  std::vector<int> owner(blocks.size(), -1);  // wrapped run index, -2 ignored
  for (size_t b : ignored_blocks) owner[b] = -2;
  for (size_t r = 0; r < plan.runs.size(); ++r)
    for (size_t b = plan.runs[r].first; b <= plan.runs[r].last; ++b) owner[b] = static_cast<int>(r);
  plan.run_params.resize(plan.runs.size());
  for (size_t b = 0; b < blocks.size(); ++b)
    for (const auto& [name, numel] : blocks[b].params) {
      if (owner[b] == -2)
        plan.ignored.push_back(name);
      else if (owner[b] >= 0 && !is_shared(name))
        plan.run_params[static_cast<size_t>(owner[b])].push_back(name);
      else
        plan.root.push_back(name);
    }
  return plan;
}

}  // namespace strata::fsdp
