#include "fsdp_sharded_init.h"

#include <algorithm>
#include <stdexcept>

#include <ATen/ATen.h>

namespace strata::fsdp {

std::vector<UnitLayout> unit_layouts(const UnitPlan& plan, const std::function<bool(const std::string&)>& split_expert) {
  std::map<std::string, int64_t> numel;
  for (const auto& block : plan.blocks)
    for (const auto& [name, n] : block.params) numel[name] = n;
  std::vector<UnitLayout> out;
  auto add = [&](const std::string& name, const std::vector<std::string>& params) {
    UnitLayout dense{name, {}, false}, experts{name + ".experts", {}, true};
    for (const auto& p : params) (split_expert(p) ? experts : dense).params.emplace_back(p, numel.at(p));
    if (!dense.params.empty()) out.push_back(std::move(dense));
    if (!experts.params.empty()) out.push_back(std::move(experts));
  };
  for (size_t r = 0; r < plan.runs.size(); ++r)
    if (!plan.run_params[r].empty()) add(plan.blocks[plan.runs[r].first].name, plan.run_params[r]);
  if (!plan.root.empty()) add("root", plan.root);
  return out;
}

ShardKeeper::ShardKeeper(std::vector<UnitLayout> units, ChunkGroup shard, ChunkGroup experts, bool hybrid)
    : units_(std::move(units)), shard_ranks_(shard.ranks), expert_ranks_(experts.ranks), hybrid_(hybrid) {
  for (size_t u = 0; u < units_.size(); ++u) {
    const ChunkGroup group = units_[u].experts ? experts : shard;
    int64_t offset = 0;
    for (const auto& [name, n] : units_[u].params) slots_[name] = Slot{u, offset}, offset += n;
    const int64_t padded = (offset + group.ranks - 1) / group.ranks * group.ranks;
    chunk_.push_back(padded / group.ranks);
    chunk_begin_.push_back(padded / group.ranks * group.rank);
    ranks_.push_back(group.ranks);
  }
  // One allocation for every chunk, made before anything is drawn: chunks allocated as blocks
  // come would sit between the blocks' freed memory and keep the allocator from giving it back
  // (measured: GPT-2 medium's build peak 1.7x the formula that way, above a whole build's).
  int64_t total = 0;
  for (int64_t c : chunk_) total += c;
  const at::Tensor all = at::zeros({total}, at::kFloat);
  for (size_t u = 0, offset = 0; u < units_.size(); offset += static_cast<size_t>(chunk_[u]), ++u)
    chunks_.push_back(all.narrow(0, static_cast<int64_t>(offset), chunk_[u]));
}

void ShardKeeper::built(size_t, const std::string& name, nn::Block& block) {
  at::NoGradGuard no_grad;
  for (auto& named : block.named_parameters()) {
    at::Tensor& p = named.value();
    const auto slot = slots_.find(name + "." + named.key());
    if (slot == slots_.end() || !p.requires_grad()) continue;  // an ignored block's, or frozen: kept whole
    const size_t u = slot->second.unit;
    const int64_t offset = slot->second.offset, begin = std::max(offset, chunk_begin_[u]),
                  end = std::min(offset + p.numel(), chunk_begin_[u] + chunk_[u]);
    if (begin < end) chunks_[u].narrow(0, begin - chunk_begin_[u], end - begin).copy_(p.detach().reshape(-1).narrow(0, begin - offset, end - begin));
    kept_ += std::max<int64_t>(end - begin, 0), seen_ += p.numel();
    p.set_data(nn::placeholder(p.sizes(), p.options()));
  }
}

std::string ShardKeeper::summary() const {
  const bool experts = std::any_of(units_.begin(), units_.end(), [](const UnitLayout& u) { return u.experts; });
  std::string line = "fsdp kept " + std::to_string(kept_) + " of " + std::to_string(seen_) + " sharded parameters (1/" +
                     std::to_string(shard_ranks_) + " of each unit";
  // Under HSDP whose expert groups span several shard groups no other rank of the shard group
  // holds this rank's experts: it keeps them whole (fsdp_hybrid.h).
  if (experts && hybrid_ && expert_ranks_ == 1) line += ", its experts whole";
  else if (experts) line += ", its experts 1/" + std::to_string(expert_ranks_) + " over the expert-data ranks" + (hybrid_ ? " of its shard group" : "");
  return line + ", sharded as built)";
}

bool ShardKeeper::planned(const UnitLayout& unit) const {
  return std::any_of(units_.begin(), units_.end(), [&](const UnitLayout& u) { return u.name == unit.name && u.params == unit.params; });
}

void ShardKeeper::restore_changed_units(const std::vector<UnitLayout>& built, const std::map<std::string, at::Tensor>& params,
                                        Communicator& shard, Communicator& experts, c10::Device device) {
  at::NoGradGuard no_grad;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (std::find(built.begin(), built.end(), units_[u]) != built.end()) continue;
    const at::Tensor chunk = std::exchange(chunks_[u], at::Tensor()).to(device);
    at::Tensor full = at::empty({chunk_[u] * ranks_[u]}, chunk.options());
    (units_[u].experts ? experts : shard).all_gather(full, chunk)->wait();
    int64_t offset = 0;
    for (const auto& [name, n] : units_[u].params) {
      at::Tensor p = params.at(name);
      p.set_data(full.narrow(0, offset, n).view(p.sizes()).to(p.scalar_type()).clone());
      offset += n;
    }
  }
}

at::Tensor ShardKeeper::take_chunk(const UnitLayout& unit) {
  const auto it = std::find_if(units_.begin(), units_.end(), [&](const UnitLayout& u) { return u.name == unit.name; });
  if (it == units_.end() || it->params != unit.params)
    throw std::logic_error("fsdp: unit '" + unit.name + "' of the built model is not the unit planned on its outline");
  const size_t u = static_cast<size_t>(it - units_.begin());
  return std::exchange(chunks_[u], at::Tensor());
}

}  // namespace strata::fsdp
