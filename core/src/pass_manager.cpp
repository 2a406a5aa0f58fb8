#include "strata/core/pass_manager.h"

#include <algorithm>
#include <map>
#include <queue>
#include <set>

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
      // Report each conflicting pair once, at the later of the two.
      if (it != slot.end() && enabled[it->second] < i)
        diagnostics.error(entry.pos, "pass '" + entry.pass->name() + "' conflicts with pass '" + other + "' (at " +
                                         passes[enabled[it->second]].pos.str() + "); enable only one of them");
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

}  // namespace strata
