// What a pass declares it takes over: dimensions of the device mesh and stages of the step
// program. Declarations are static (read by `strata plan` before anything runs), so conflicts
// and unclaimed dimensions are refused at plan time; at run time a pass may own or wrap only the
// stages it declared.
#pragma once

#include <vector>

#include "strata/export.h"

namespace strata {

// Named dimensions of the device mesh ([parallel]). Expert is not a factor of the world size but
// of data's: each group of `expert` consecutive data ranks splits the experts of every
// mixture-of-experts layer among its members (Megatron's expert parallel inside data parallel).
enum class Dim { Data, Tensor, Pipeline, Context, Expert };
STRATA_API const char* dim_name(Dim dim);

// The stages of one training step, in the order they run, then evaluation.
//   prepare_batches   this rank's micro-batches of the global batch (sliced by every dimension
//                     that shards data)
//   gradients         forward_backward, then sync_gradients; passes that run the pair more than
//                     once (WSAM) or around it (amp's loss scaling) wrap this stage
//   forward_backward  the micro-batch schedule: forward, loss, backward per micro-batch (a
//                     pipeline replaces it with its action list)
//   sync_gradients    make gradients agree across replicas (ddp, zero, fsdp)
//   clip_gradients    the global gradient norm and clipping
//   optimizer_step    the update (skipped when a hook set skip_step)
//   evaluate          the validation loss, through the same forward and loss as training
enum class Stage { PrepareBatches, Gradients, ForwardBackward, SyncGradients, ClipGradients, OptimizerStep, Evaluate };
STRATA_API const char* stage_name(Stage stage);
inline constexpr Stage kAllStages[] = {Stage::PrepareBatches, Stage::Gradients,     Stage::ForwardBackward, Stage::SyncGradients,
                                       Stage::ClipGradients,  Stage::OptimizerStep, Stage::Evaluate};

// Owning a stage replaces core's implementation (one owner per stage); wrapping runs around
// whoever owns it (any number, applied in pass order: the last applied is outermost).
enum class StageUse { Own, Wrap };
struct StageClaim {
  Stage stage;
  StageUse use;
};

struct Claims {
  std::vector<Dim> dims;            // mesh dimensions this pass parallelises over (one pass each)
  std::vector<StageClaim> stages;   // step-program stages it owns or wraps
};

}  // namespace strata
