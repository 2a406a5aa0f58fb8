// Pipeline schedules as data: adding the messages between ranks, simulating a step to prove it
// complete and deadlock-free, and drawing it (strata/pipeline.h).
#include "strata/pipeline.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "strata/core/schedules.h"

namespace strata::pipeline {

namespace {

ComponentInfo as_schedule(ComponentInfo info) {
  info.kind = ComponentKind::Schedule;
  return info;
}

const ComponentRegistry* installed = nullptr;

bool is_compute(ActionKind kind) {
  return kind == ActionKind::Forward || kind == ActionKind::Backward || kind == ActionKind::BackwardInput ||
         kind == ActionKind::BackwardWeight;
}

std::string describe(const Action& a, int rank) {
  return std::string(action_name(a.kind)) + "(micro " + std::to_string(a.micro) + ", chunk " + std::to_string(a.chunk) +
         ") on rank " + std::to_string(rank);
}

}  // namespace

Schedule::Schedule(ComponentInfo info) : Component(as_schedule(std::move(info))) {}
Schedule::~Schedule() = default;
std::string Schedule::shape_problem(const ScheduleShape&) const { return {}; }

const char* action_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward: return "forward";
    case ActionKind::Backward: return "backward";
    case ActionKind::BackwardInput: return "backward_input";
    case ActionKind::BackwardWeight: return "backward_weight";
    case ActionKind::SendActivation: return "send_activation";
    case ActionKind::RecvActivation: return "recv_activation";
    case ActionKind::SendGradient: return "send_gradient";
    case ActionKind::RecvGradient: return "recv_gradient";
  }
  return "?";
}

Programs add_communication(const Programs& compute, const ScheduleShape& shape) {
  const int p = shape.ranks, last = shape.virtual_stages() - 1;
  Programs out(compute.size());
  for (size_t r = 0; r < compute.size(); ++r)
    for (const Action& a : compute[r]) {
      const int stage = a.chunk * p + static_cast<int>(r);
      const bool backward = a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput;
      if (a.kind == ActionKind::Forward && stage > 0) out[r].push_back({ActionKind::RecvActivation, a.micro, a.chunk});
      if (backward && stage < last) out[r].push_back({ActionKind::RecvGradient, a.micro, a.chunk});
      out[r].push_back(a);
      if (a.kind == ActionKind::Forward && stage < last) out[r].push_back({ActionKind::SendActivation, a.micro, a.chunk});
      if (backward && stage > 0) out[r].push_back({ActionKind::SendGradient, a.micro, a.chunk});
    }
  return out;
}

namespace {

// Every compute action exactly once: a forward and a backward (whole, or input + weight) of every
// micro-batch on every chunk; empty when so.
std::string coverage_problem(const Programs& programs, const ScheduleShape& shape) {
  const int p = shape.ranks, v = shape.chunks, m = shape.micro_batches;
  std::map<std::tuple<int, int, int, int>, int> seen;  // (rank, kind, micro, chunk) -> count
  for (int r = 0; r < p; ++r)
    for (const Action& a : programs[static_cast<size_t>(r)]) {
      if (a.micro < 0 || a.micro >= m || a.chunk < 0 || a.chunk >= v) {
        return describe(a, r) + " is outside the step's " + std::to_string(m) + " micro-batches and " + std::to_string(v) + " chunks";
      }
      if (is_compute(a.kind) && ++seen[{r, static_cast<int>(a.kind), a.micro, a.chunk}] > 1) return describe(a, r) + " runs twice";
    }
  for (int r = 0; r < p; ++r)
    for (int c = 0; c < v; ++c)
      for (int mb = 0; mb < m; ++mb) {
        auto has = [&](ActionKind k) { return seen.count({r, static_cast<int>(k), mb, c}) > 0; };
        const bool whole = has(ActionKind::Backward), split = has(ActionKind::BackwardInput) && has(ActionKind::BackwardWeight);
        const char* missing = !has(ActionKind::Forward) ? "forward" : (whole == split) ? (whole ? nullptr : "backward") : nullptr;
        if (whole && (has(ActionKind::BackwardInput) || has(ActionKind::BackwardWeight))) missing = "a single kind of backward";
        if (!whole && has(ActionKind::BackwardInput) != has(ActionKind::BackwardWeight)) missing = "both halves of the split backward";
        if (missing) return "rank " + std::to_string(r) + " has no " + missing + " of micro-batch " + std::to_string(mb) + " on chunk " + std::to_string(c);
      }
  return {};
}

// After the run: a deadlock when a rank could not finish its program, else the makespan and the
// fraction of it the ranks idled.
void summarize(Simulation& sim, const Programs& programs, const std::vector<size_t>& pc, const std::vector<double>& clock,
               const std::vector<double>& busy) {
  const size_t p = programs.size();
  std::string stuck;
  for (size_t r = 0; r < p; ++r)
    if (pc[r] < programs[r].size()) stuck += (stuck.empty() ? "" : "; ") + describe(programs[r][pc[r]], static_cast<int>(r)) + " waits forever";
  if (!stuck.empty()) {
    sim.problem = "deadlock: " + stuck;
    return;
  }
  for (size_t r = 0; r < p; ++r) sim.makespan = std::max(sim.makespan, clock[r]);
  double idle = 0;
  for (size_t r = 0; r < p; ++r) idle += sim.makespan - busy[r];
  sim.idle_fraction = sim.makespan > 0 ? idle / (sim.makespan * static_cast<double>(p)) : 0.0;
}

}  // namespace

Simulation simulate(const Programs& programs, const ScheduleShape& shape, const ActionCosts& costs) {
  Simulation sim;
  const int p = shape.ranks, v = shape.chunks, m = shape.micro_batches, last = shape.virtual_stages() - 1;
  if (static_cast<int>(programs.size()) != p) {
    sim.problem = "the schedule has programs for " + std::to_string(programs.size()) + " ranks, not " + std::to_string(p);
    return sim;
  }
  if (sim.problem = coverage_problem(programs, shape); !sim.problem.empty()) return sim;

  // Run: a compute action takes its cost; a send is posted at once; a receive waits for its send.
  // Local order: forward before its backward, input gradient before weight gradient, and a
  // compute's message before it (receive) or after it (send).
  std::map<std::tuple<int, int, int, int>, double> done;  // (rank, kind, micro, chunk) -> end time
  auto finished = [&](int r, ActionKind k, int mb, int c) { return done.count({r, static_cast<int>(k), mb, c}) > 0; };
  std::vector<size_t> pc(static_cast<size_t>(p), 0);
  std::vector<double> clock(static_cast<size_t>(p), 0.0), busy(static_cast<size_t>(p), 0.0);
  std::vector<int> in_flight(static_cast<size_t>(p), 0);
  sim.peak_in_flight.assign(static_cast<size_t>(p), 0);
  sim.timeline.assign(static_cast<size_t>(p), {});
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int r = 0; r < p; ++r) {
      auto& program = programs[static_cast<size_t>(r)];
      for (size_t& i = pc[static_cast<size_t>(r)]; i < program.size(); ++i) {
        const Action& a = program[i];
        const int stage = a.chunk * p + r;
        double& now = clock[static_cast<size_t>(r)];
        double start = now, cost = 0;
        auto local_problem = [&](const std::string& need) {
          sim.problem = describe(a, r) + " runs before " + need;
          return sim;
        };
        switch (a.kind) {
          case ActionKind::RecvActivation:
          case ActionKind::RecvGradient: {
            const bool activation = a.kind == ActionKind::RecvActivation;
            const int from_stage = activation ? stage - 1 : stage + 1;
            if (from_stage < 0 || from_stage > last) return local_problem("a sender exists (no neighbouring stage)");
            auto it = done.find({from_stage % p, static_cast<int>(activation ? ActionKind::SendActivation : ActionKind::SendGradient), a.micro,
                                 from_stage / p});
            if (it == done.end()) goto blocked;
            start = std::max(now, it->second);
            break;
          }
          case ActionKind::SendActivation:
            if (!finished(r, ActionKind::Forward, a.micro, a.chunk)) return local_problem("its forward");
            break;
          case ActionKind::SendGradient:
            if (!finished(r, ActionKind::Backward, a.micro, a.chunk) && !finished(r, ActionKind::BackwardInput, a.micro, a.chunk))
              return local_problem("its backward");
            break;
          case ActionKind::Forward:
            if (stage > 0 && !finished(r, ActionKind::RecvActivation, a.micro, a.chunk)) return local_problem("its input arrives");
            cost = costs.forward;
            break;
          case ActionKind::Backward:
          case ActionKind::BackwardInput:
            if (!finished(r, ActionKind::Forward, a.micro, a.chunk)) return local_problem("its forward");
            if (stage < last && !finished(r, ActionKind::RecvGradient, a.micro, a.chunk)) return local_problem("its output gradient arrives");
            cost = costs.backward_input + (a.kind == ActionKind::Backward ? costs.backward_weight : 0.0);
            break;
          case ActionKind::BackwardWeight:
            if (!finished(r, ActionKind::BackwardInput, a.micro, a.chunk)) return local_problem("its input gradient");
            cost = costs.backward_weight;
            break;
        }
        if (done.count({r, static_cast<int>(a.kind), a.micro, a.chunk})) {
          sim.problem = describe(a, r) + " runs twice";
          return sim;
        }
        done[{r, static_cast<int>(a.kind), a.micro, a.chunk}] = start + cost;
        now = start + cost;
        busy[static_cast<size_t>(r)] += cost;
        if (a.kind == ActionKind::Forward) ++in_flight[static_cast<size_t>(r)];
        // A micro-batch's memory is held from its forward until its backward is whole: with the
        // backward split, its deferred weight gradients keep each linear's input and output
        // gradient (for a GPT layer 16 of the 16 values per token its activations were; measured
        // at pipeline 2, 8 micro-batches: zero_bubble 202 MB of live tensors where 1f1b's 104).
        if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardWeight) --in_flight[static_cast<size_t>(r)];
        sim.peak_in_flight[static_cast<size_t>(r)] = std::max(sim.peak_in_flight[static_cast<size_t>(r)], in_flight[static_cast<size_t>(r)]);
        if (is_compute(a.kind)) sim.timeline[static_cast<size_t>(r)].push_back({a, start, start + cost});
        progressed = true;
      }
    blocked:;
    }
  }
  summarize(sim, programs, pc, clock, busy);
  return sim;
}

std::string render_timeline(const Simulation& simulation, const ScheduleShape& shape) {
  std::ostringstream out;
  const int width = shape.chunks > 1 ? 6 : 4;
  const auto units = static_cast<size_t>(std::llround(simulation.makespan));
  for (size_t r = 0; r < simulation.timeline.size(); ++r) {
    std::vector<std::string> cells(units, ".");
    for (const TimedAction& t : simulation.timeline[r]) {
      const char letter = t.action.kind == ActionKind::Forward ? 'F' : t.action.kind == ActionKind::Backward ? 'B'
                          : t.action.kind == ActionKind::BackwardInput ? 'b' : 'W';
      std::string cell = letter + std::to_string(t.action.micro);
      if (shape.chunks > 1) cell += ":" + std::to_string(t.action.chunk);
      for (auto u = static_cast<size_t>(std::llround(t.start)); u < static_cast<size_t>(std::llround(t.end)) && u < units; ++u) cells[u] = cell;
    }
    out << "    rank " << r << " |";
    for (const auto& cell : cells) out << cell << std::string(static_cast<size_t>(std::max<int>(1, width - static_cast<int>(cell.size()))), ' ');
    out << "\n";
  }
  return out.str();
}

void install_schedules(const ComponentRegistry& registry) { installed = &registry; }

const Schedule* find_schedule(const std::string& name) {
  return installed ? dynamic_cast<const Schedule*>(installed->find(ComponentKind::Schedule, name)) : nullptr;
}

std::vector<std::string> schedule_names() { return installed ? installed->names(ComponentKind::Schedule) : std::vector<std::string>{}; }

}  // namespace strata::pipeline
