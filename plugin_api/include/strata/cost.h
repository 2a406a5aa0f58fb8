// What `strata tune` predicts of one candidate strategy before running it: the bytes one rank
// holds at its peak and the work it does in one optimizer step.
//
// The prediction is built in two steps so that a pass that lands later joins the cost model by
// itself, without a change to tune. Core fills in the figures of one process training the
// data-parallel rank's share of the global batch on the whole model (weights and gradients at
// 4 + 4 bytes per parameter, the optimizer's state as the optimizer holds it (AdamW 8),
// activations as Strata's blocks save them (tune/cost_model.cpp), 6 FLOPs per parameter and token plus attention), from
// the model's shape (ModelFactory::shape). Then every enabled pass, in the order the passes
// apply, rescales what it changes (Pass::estimate): tensor parallel divides the layers'
// parameters and activations by its size and adds its all-reduces, zero and fsdp divide model
// states over the data ranks and add their collectives, a pipeline keeps its stage's layers and
// sets the micro-batches in flight and the idle fraction its schedule simulates, activation
// checkpointing keeps only block inputs and adds the recomputation.
#pragma once

#include <cstdint>

namespace strata {

// The sizes of a model that the cost model needs, read from [model] without building it.
struct ModelShape {
  int64_t parameters = 0;     // every trainable parameter
  int64_t layer_parameters = 0;  // of one transformer layer (the largest repeated block)
  int64_t layers = 0;         // transformer layers
  int64_t hidden = 0;         // d_model
  int64_t heads = 0;          // query heads
  int64_t kv_heads = 0;       // key/value heads (heads without grouped-query attention)
  int64_t ffn_hidden = 0;     // the MLP's inner width
  int64_t seq_len = 0;        // tokens per sequence
  int64_t vocab = 0;
  int64_t blocks = 0;         // blocks of the built nn::Model (what a pipeline partitions); 0: not known
};

struct CostEstimate {
  // Inputs passes read (core sets them; passes leave them alone).
  ModelShape model;
  int64_t micro_batch = 1;    // sequences in one forward/backward on this rank
  int64_t micro_batches = 1;  // forward/backward passes per optimizer step on this rank
  int64_t data = 1, tensor = 1, pipeline = 1, context = 1;  // the mesh
  double layers_per_rank = 0;  // transformer layers one pipeline stage runs
  double seq_per_rank = 0;     // tokens of a sequence one context rank holds
  double activation_element_bytes = 4;  // what one saved activation element takes (fp32; amp halves it)

  // Memory per rank, bytes.
  double weight_bytes = 0;       // parameters as stored
  double gradient_bytes = 0;     // their gradients (core moves them into transient_bytes after the passes where none survives the forward)
  double optimizer_bytes = 0;    // optimizer state (AdamW's two moments: 8 bytes per parameter)
  double activation_bytes = 0;   // saved for backward by one micro-batch through this rank's layers
  double in_flight = 1;          // micro-batches whose activations are held at once (pipelines)
  double transient_bytes = 0;    // the largest short-lived buffer: logits and their gradient, a gathered unit
  // Work per rank per optimizer step.
  double flops = 0;              // forward, backward and recomputation
  double comm_bytes = 0;         // what this rank sends in collectives and point-to-point messages
  double messages = 0;           // collectives and point-to-point calls it makes (each pays the latency)
  double bubble = 0;             // fraction of the step a rank idles (pipeline schedules)

  double peak_bytes() const {
    return weight_bytes + gradient_bytes + optimizer_bytes + activation_bytes * in_flight + transient_bytes;
  }
};

}  // namespace strata
