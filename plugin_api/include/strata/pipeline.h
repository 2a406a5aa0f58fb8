// Pipeline schedules as data. A schedule says, for each pipeline rank, the order of its compute
// actions over the micro-batches of one step; core adds the sends and receives between ranks,
// checks the result by simulation (every action once, no deadlock) and the pipeline pass's
// runtime executes exactly that list. `strata plan` prints it as a per-rank timeline.
//
// Stages: with p ranks and v chunks per rank there are S = p * v virtual stages, each a
// contiguous run of the model's blocks; virtual stage s runs on rank s % p as its chunk s / p
// (Megatron's interleaved placement; v = 1 is the plain pipeline).
#pragma once

#include <string>
#include <vector>

#include "strata/component.h"

namespace strata::pipeline {

enum class ActionKind {
  Forward,         // the chunk's forward of one micro-batch (and the loss on the last stage)
  Backward,        // its whole backward
  BackwardInput,   // its backward, weight gradients of split layers held back (zero bubble)
  BackwardWeight,  // those held-back weight gradients
  SendActivation,  // the forward's output to the next virtual stage's rank
  RecvActivation,  // the forward's input from the previous one
  SendGradient,    // the backward's input gradient to the previous virtual stage's rank
  RecvGradient,    // the backward's output gradient from the next one
};
STRATA_API const char* action_name(ActionKind kind);

struct Action {
  ActionKind kind;
  int micro = 0;  // micro-batch
  int chunk = 0;  // this rank's chunk (0 .. v-1)
  bool operator==(const Action&) const = default;
};

struct ScheduleShape {
  int ranks = 1;          // p, pipeline ranks
  int micro_batches = 1;  // m, per step
  int chunks = 1;         // v, chunks per rank
  int virtual_stages() const { return ranks * chunks; }
};

// programs[r]: rank r's actions in the order it runs them.
using Programs = std::vector<std::vector<Action>>;

class STRATA_API Schedule : public Component {
 public:
  // info.kind is forced to ComponentKind::Schedule.
  explicit Schedule(ComponentInfo info);
  ~Schedule() override;
  // Why this schedule cannot run `shape` (e.g. interleaving needs m % p == 0), or empty.
  virtual std::string shape_problem(const ScheduleShape& shape) const;
  // Chunks per rank this schedule uses, given the pass's `chunks` option (1 for plain schedules).
  virtual int chunks(int requested) const { return requested; }
  // Each rank's compute actions (Forward, Backward or BackwardInput + BackwardWeight), in order.
  virtual Programs compute_order(const ScheduleShape& shape) const = 0;
  // The textbook bubble fraction of the step, for `strata plan` to show next to the simulation.
  virtual std::string bubble_formula(const ScheduleShape& shape) const = 0;
};

// The compute order with the messages between ranks added: a receive just before the compute
// that needs it, a send just after the compute that produced it.
STRATA_API Programs add_communication(const Programs& compute, const ScheduleShape& shape);

// Relative durations for simulation (a whole backward is input + weight).
struct ActionCosts {
  double forward = 1.0, backward_input = 1.0, backward_weight = 1.0;
};

// One action as the simulation placed it.
struct TimedAction {
  Action action;
  double start = 0, end = 0;
};

// The result of running `programs` on ideal ranks where a send completes at once and a receive
// waits for its send. `problem` says what is wrong (a compute action missing, repeated or out of
// dependency order, a message without its partner, or a deadlock naming the ranks stuck and what
// they wait for); when empty, `timeline` holds every rank's actions with their times.
struct Simulation {
  std::string problem;
  std::vector<std::vector<TimedAction>> timeline;
  double makespan = 0;
  // Idle time over ranks x makespan; and per rank the most micro-batches whose activations are
  // held at once (forwarded, backward not yet whole: a split backward's weight gradients keep
  // their linears' inputs and output gradients until they run).
  double idle_fraction = 0;
  std::vector<int> peak_in_flight;
};
STRATA_API Simulation simulate(const Programs& programs, const ScheduleShape& shape, const ActionCosts& costs = {});

// The timeline as text: one line per rank, one cell per unit of time ("F3", "B3", "b3" input
// gradient, "W3" weight gradient, "." idle; with chunks, the chunk after a colon).
STRATA_API std::string render_timeline(const Simulation& simulation, const ScheduleShape& shape);

// The registered schedule named `name`, or null. Core installs the loaded plugins' schedules
// before passes run and before `strata plan` asks passes about their plans.
STRATA_API const Schedule* find_schedule(const std::string& name);
STRATA_API std::vector<std::string> schedule_names();

}  // namespace strata::pipeline
