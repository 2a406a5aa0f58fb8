#include "strata/core/pass_manager.h"

#include <algorithm>
#include <map>
#include <queue>
#include <set>

#include "strata/pass.h"

namespace strata {

namespace {

struct Graph {
  std::vector<std::set<size_t>> successors;  // by position in `enabled`
  std::vector<int> indegree;
};

// Names one cycle among nodes that Kahn's algorithm could not place.
std::vector<size_t> find_cycle(const Graph& graph, const std::vector<bool>& placed) {
  const size_t n = graph.successors.size();
  std::vector<int> state(n, 0);  // 0 unvisited, 1 on stack, 2 done
  std::vector<size_t> stack;
  std::vector<size_t> cycle;
  auto dfs = [&](auto&& self, size_t v) -> bool {
    state[v] = 1;
    stack.push_back(v);
    for (size_t w : graph.successors[v]) {
      if (placed[w]) continue;
      if (state[w] == 1) {
        cycle.assign(std::find(stack.begin(), stack.end(), w), stack.end());
        cycle.push_back(w);
        return true;
      }
      if (state[w] == 0 && self(self, w)) return true;
    }
    stack.pop_back();
    state[v] = 2;
    return false;
  };
  for (size_t v = 0; v < n; ++v)
    if (!placed[v] && state[v] == 0 && dfs(dfs, v)) break;
  return cycle;
}

}  // namespace

std::vector<size_t> order_passes(const std::vector<PassEntry>& passes, Diagnostics& diagnostics) {
  const size_t before = diagnostics.items().size();
  std::vector<size_t> enabled;  // indices into passes
  std::map<std::string, size_t> slot;  // pass name -> position in `enabled`
  for (size_t i = 0; i < passes.size(); ++i)
    if (passes[i].enabled) {
      slot[passes[i].pass->name()] = enabled.size();
      enabled.push_back(i);
    }

  for (size_t i : enabled) {
    const PassEntry& entry = passes[i];
    const PassOrdering& ordering = entry.pass->ordering();
    for (const auto& needed : ordering.requires_passes)
      if (!slot.count(needed))
        diagnostics.error(entry.pos, "pass '" + entry.pass->name() + "' requires pass '" + needed +
                                         "', which the strategy does not enable; add a [[pass]] with name = \"" + needed + "\"");
    for (const auto& other : ordering.conflicts_with) {
      auto it = slot.find(other);
      if (it == slot.end()) continue;
      const size_t j = enabled[it->second];
      // Report each conflicting pair once, at the later of the two, whichever declared it.
      const StringList& theirs = passes[j].pass->ordering().conflicts_with;
      const bool mutual = std::find(theirs.begin(), theirs.end(), entry.pass->name()) != theirs.end();
      if (mutual && j > i) continue;
      const PassEntry& later = passes[std::max(i, j)];
      const PassEntry& earlier = passes[std::min(i, j)];
      diagnostics.error(later.pos, "pass '" + later.pass->name() + "' conflicts with pass '" + earlier.pass->name() + "' (at " +
                                       earlier.pos.str() + "); enable only one of them");
    }
  }

  Graph graph{std::vector<std::set<size_t>>(enabled.size()), std::vector<int>(enabled.size(), 0)};
  auto edge = [&](size_t from, size_t to) {
    if (graph.successors[from].insert(to).second) ++graph.indegree[to];
  };
  for (size_t v = 0; v < enabled.size(); ++v) {
    const PassOrdering& ordering = passes[enabled[v]].pass->ordering();
    for (const auto& name : ordering.after)
      if (auto it = slot.find(name); it != slot.end()) edge(it->second, v);
    for (const auto& name : ordering.before)
      if (auto it = slot.find(name); it != slot.end()) edge(v, it->second);
  }

  // Kahn's algorithm; among the passes that are free to run, the earliest phase goes first,
  // then the earliest in the strategy file. That makes the order deterministic.
  auto priority = [&](size_t v) { return std::pair(static_cast<int>(passes[enabled[v]].pass->ordering().phase), v); };
  auto later = [&](size_t a, size_t b) { return priority(a) > priority(b); };
  std::priority_queue<size_t, std::vector<size_t>, decltype(later)> ready(later);
  std::vector<int> indegree = graph.indegree;
  for (size_t v = 0; v < enabled.size(); ++v)
    if (indegree[v] == 0) ready.push(v);
  std::vector<size_t> order;
  std::vector<bool> placed(enabled.size(), false);
  while (!ready.empty()) {
    size_t v = ready.top();
    ready.pop();
    placed[v] = true;
    order.push_back(enabled[v]);
    for (size_t w : graph.successors[v])
      if (--indegree[w] == 0) ready.push(w);
  }
  if (order.size() != enabled.size()) {
    std::vector<size_t> cycle = find_cycle(graph, placed);
    std::string names;
    for (size_t v : cycle) names += (names.empty() ? "" : " -> ") + passes[enabled[v]].pass->name();
    diagnostics.error(passes[enabled[cycle.front()]].pos,
                      "pass ordering has a cycle: " + names +
                          " ('a -> b' means a must run before b, from after/before declarations); disable one of them");
  }
  if (diagnostics.items().size() != before) return {};
  return order;
}

namespace {

bool declares_conflict(const Pass& a, const Pass& b) {
  auto has = [](const StringList& list, const std::string& name) { return std::find(list.begin(), list.end(), name) != list.end(); };
  return has(a.ordering().conflicts_with, b.name()) || has(b.ordering().conflicts_with, a.name());
}

int64_t layout_size(const ParallelLayout& layout, Dim dim) {
  switch (dim) {
    case Dim::Data: return layout.mesh.data;
    case Dim::Tensor: return layout.mesh.tensor;
    case Dim::Pipeline: return layout.mesh.pipeline;
    case Dim::Context: return layout.mesh.context;
    case Dim::Expert: return layout.mesh.expert;
  }
  return 1;
}

}  // namespace

void check_claims(const ResolvedStrategy& plan, const ComponentRegistry& registry, Diagnostics& diagnostics) {
  std::vector<const PassEntry*> enabled;
  for (const auto& p : plan.passes)
    if (p.enabled) enabled.push_back(&p);
  const SourcePos parallel_pos = plan.parallel.has("data") && plan.parallel.entry("data").pos.line ? plan.parallel.entry("data").pos
                                                                                                    : SourcePos{plan.file, 0, 0};
  for (Dim dim : {Dim::Data, Dim::Tensor, Dim::Pipeline, Dim::Context, Dim::Expert}) {
    std::vector<const PassEntry*> claimants;
    for (const PassEntry* p : enabled) {
      const auto& dims = p->pass->claims().dims;
      if (std::find(dims.begin(), dims.end(), dim) != dims.end()) claimants.push_back(p);
    }
    for (size_t a = 0; a < claimants.size(); ++a)
      for (size_t b = a + 1; b < claimants.size(); ++b)
        if (!declares_conflict(*claimants[a]->pass, *claimants[b]->pass))
          diagnostics.error(claimants[b]->pos, "pass '" + claimants[b]->pass->name() + "' and pass '" + claimants[a]->pass->name() +
                                                   "' (at " + claimants[a]->pos.str() + ") both claim the " + dim_name(dim) +
                                                   " dimension; enable only one of them");
    const int64_t size = layout_size(plan.layout, dim);
    if (size <= 1 || !claimants.empty()) continue;
    std::string candidates;
    for (const Component* c : registry.components(ComponentKind::Pass)) {
      const auto& dims = static_cast<const Pass*>(c)->claims().dims;
      if (std::find(dims.begin(), dims.end(), dim) != dims.end()) candidates += (candidates.empty() ? "" : ", ") + c->name();
    }
    const std::string key = dim_name(dim);
    const SourcePos pos = plan.parallel.has(key) && plan.parallel.entry(key).pos.line ? plan.parallel.entry(key).pos : parallel_pos;
    diagnostics.error(pos, "[parallel] " + key + " = " + std::to_string(size) + " but no enabled pass claims the " + key +
                               " dimension, so its ranks would repeat each other's work; " +
                               (candidates.empty() ? "no registered pass implements it yet (see `strata plugins`)"
                                                   : "enable one of: " + candidates));
  }
  for (Stage stage : kAllStages) {
    const PassEntry* owner = nullptr;
    for (const PassEntry* p : enabled) {
      if (!p->pass->claims_stage(stage, StageUse::Own)) continue;
      if (owner && !declares_conflict(*owner->pass, *p->pass))
        diagnostics.error(p->pos, "pass '" + p->pass->name() + "' and pass '" + owner->pass->name() + "' (at " + owner->pos.str() +
                                      ") both own the step stage '" + stage_name(stage) + "'; enable only one of them");
      if (!owner) owner = p;
    }
  }
}

}  // namespace strata
