// Passes transform a training job. The pass manager orders them by phase and by their
// requires/conflicts/after/before declarations.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include "strata/claims.h"
#include "strata/component.h"
#include "strata/cost.h"

namespace strata {

class Job;  // the training job a pass transforms; defined by the training runtime
namespace nn {
class Model;
class BuildKeeper;
}

// Default order of passes; explicit after/before declarations override it.
// How `strata tune` treats a pass the strategy does not name. A pass that claims a mesh dimension
// is a layout choice: tune enables one of the passes claiming each dimension it sizes above one.
enum class TuneUse {
  UserOnly,  // never added by tune: it changes the maths (precision, the optimizer) or needs a choice only the user can make
  Try,       // tune tries the strategy with and without it (exact: trades memory for time, or time for nothing)
};

enum class Phase { Topology, ModelRewrite, Precision, Wrapping, Optimizer, Schedule, Runtime };
STRATA_API const char* phase_name(Phase phase);

struct PassOrdering {
  Phase phase = Phase::Runtime;
  StringList requires_passes;  // must be enabled too
  StringList conflicts_with;   // must not be enabled together
  StringList after;            // runs after these when they are enabled
  StringList before;           // runs before these when they are enabled
};

// The mesh a strategy resolved to, for plan-time checks of sizes, and the micro-batches each
// data-parallel rank runs per optimizer step ([job] global_batch / data / micro_batch).
struct MeshSizes {
  int64_t data = 1, tensor = 1, pipeline = 1, context = 1;
  int64_t micro_batches = 1;
  int64_t expert = 1;  // a factor of data
};

class ModelFactory;

// What a pass may read to describe its plan: the resolved sections, the model's factory and the mesh.
struct PlanFacts {
  const Config& job;
  const Config& model;
  const ModelFactory& model_factory;
  MeshSizes mesh;
  // Where the blocks compute: [job] device's type, and the dtype an enabled precision pass
  // (amp, half) makes them compute in, float32 without one. Operator support is checked on these.
  c10::DeviceType device = c10::DeviceType::CPU;
  c10::ScalarType compute_dtype = c10::ScalarType::Float;
  std::string compute_dtype_by;  // the pass that set compute_dtype, or empty
  std::vector<std::string> enabled_passes;  // by name, in the order they apply
};

namespace detail {
struct PassState;  // the class's state, defined in core
}  // namespace detail

class STRATA_API Pass : public Component {
 public:
  // info.kind is forced to ComponentKind::Pass. `claims`: the mesh dimensions and step stages
  // the pass takes over (strata/claims.h).
  Pass(ComponentInfo info, PassOrdering ordering, Claims claims = {});
  ~Pass() override;

  const PassOrdering& ordering() const;
  const Claims& claims() const;
  bool claims_stage(Stage stage, StageUse use) const;

  virtual void apply(Job& job, const Config& config) const = 0;

  // Why this enabled pass, with its `config`, cannot run [model] `model` over `mesh` (a size that
  // does not divide, named with its keys and sizes), or empty. `strata plan` and `strata run`
  // refuse the strategy with it before anything starts. This default finds nothing.
  virtual std::string size_problem(const Config& config, const Config& model, const MeshSizes& mesh) const;

  // What `strata plan` shows for this enabled pass beyond its keys (a pipeline's stages and
  // schedule timeline), or empty (this default).
  virtual std::string describe_plan(const Config& config, const PlanFacts& facts) const;
  // The dtype this enabled pass makes the model's blocks compute in (amp's autocast dtype, half's
  // parameter dtype), or nullopt (this default) when it leaves it alone.
  virtual std::optional<c10::ScalarType> compute_dtype(const Config& config) const;
  // Why this enabled pass cannot run as `facts` describe the job (an operator implementation that
  // does not support its device or dtype), or empty (this default). Refused before anything
  // starts, like size_problem.
  virtual std::string plan_problem(const Config& config, const PlanFacts& facts) const;

  // For a pass that keeps only some of the model's blocks on this rank (pipeline parallel): the
  // indices of the blocks this rank builds, or nullopt to build them all (this default). Called
  // on every rank before the model is built, in pass order; `outline()` builds (once, on first
  // call) the model with every block absent (nn::AbsentBlock: names, types, parameter counts),
  // drawing nothing from the generators the real build draws from. Core then builds the model
  // under an nn::BlockFilter keeping these blocks; apply() still sees the whole list of blocks.
  virtual std::optional<std::vector<size_t>> blocks_to_build(const Config& config, const Job& job,
                                                             const std::function<const nn::Model&()>& outline) const;

  // For a pass that shards parameters over ranks (fsdp): called on every rank before the model is
  // built, after blocks_to_build, with the same outline (its absent blocks know their parameters'
  // names and shapes). Returns what keeps this rank's part of each block the moment the factory
  // has built it (nn::BuildKeeper), or nullptr to build the model whole (this default). Core
  // builds under it and hands it to apply() as Job::build_keeper; the parameters it let go are
  // placeholders (nn::placeholder) until apply() gives them storage again.
  virtual std::shared_ptr<nn::BuildKeeper> keeper_at_build(const Config& config, const Job& job,
                                                           const std::function<const nn::Model&()>& outline) const;

  // Whether `strata tune` may add this pass on its own (this default: UserOnly).
  virtual TuneUse tune_use() const;
  // Rescales what this enabled pass changes of `cost` (strata/cost.h), which holds the figures of
  // the passes applied before it. This default changes nothing.
  virtual void estimate(const Config& config, const PlanFacts& facts, CostEstimate& cost) const;

 private:
  // In core (one pointer here): the size every plugin's pass class embeds never changes.
  std::unique_ptr<detail::PassState> state_;
};

// Since ABI 23.1. A pass that shards parameters as the model is built (fsdp) and can do so when
// another pass keeps only some blocks on this rank (pipeline parallel) implements this too; core
// finds it by dynamic_cast and calls it instead of Pass::keeper_at_build. `outline()` is the
// outline of the blocks this rank builds: the same factory run with every block absent, then
// Model::keep_blocks with blocks_to_build's choice (the whole outline where no pass chooses), so
// it lists exactly the blocks apply() will see once the choosing pass has cut its stage.
class STRATA_API KeepsBuiltBlocks {
 public:
  virtual ~KeepsBuiltBlocks();
  virtual std::shared_ptr<nn::BuildKeeper> keeper_of_built_blocks(const Config& config, const Job& job,
                                                                  const std::function<const nn::Model&()>& outline) const = 0;
};

}  // namespace strata
