// The model IR: a model is an ordered sequence of named blocks with one activation interface
// (a tensor in, a tensor out), built from Strata layers that call operators from strata/ops.h.
// Block boundaries are where passes wrap (fsdp), cut (pipeline) and recompute (act_checkpoint).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "strata/comm.h"
#include "strata/export.h"
#include "strata/ops.h"
#include "strata/placement.h"

namespace strata::nn {

// How a layer is split over the tensor-parallel group. Column splits dimension 0 of the weight
// (a Linear's outputs, an Embedding's rows: vocab parallel), Row splits dimension 1 (a Linear's
// inputs); None is replicated. Replicated marks a whole Linear inside a split region whose output
// each rank uses only part of (Llama's k/v projections when the kv heads do not divide): its
// output gradient is summed over the group. Sequence marks what sits on the residual stream
// between a Row layer's sum and the next Column layers, which sequence parallel splits by tokens:
// a norm (whose output feeds Column layers) or a position embedding (indexed by token position).
enum class ParallelStyle { None, Column, Row, Sequence, Replicated };

// This rank's piece of a split layer: `parts` pieces, this rank holds piece `index`.
struct TensorShard {
  int64_t parts = 1;
  int64_t index = 0;
};

// Where piece `shard.index` of `size` elements split in `shard.parts` lies: pieces differ by at
// most one element, the larger first (equal when `parts` divides `size`), so a vocabulary of any
// size splits over any tensor size without padding rows.
struct ShardRange {
  int64_t start = 0, size = 0;
};
STRATA_API ShardRange shard_range(int64_t size, TensorShard shard);

// Interception points of a layer, for passes that wrap it (tensor parallel's conjugate
// collectives, fp8 casts): on_input runs on the input before the layer computes, on_output on
// its output, on_weight and on_bias on those parameters before the layer uses them (sequence
// parallel sums the gradients of whole parameters that only saw this rank's tokens). A Row-split
// Linear adds its bias after on_output, so a sum over ranks adds it once.
struct LayerHooks {
  std::function<at::Tensor(const at::Tensor&)> on_input, on_output, on_weight, on_bias;
  // Linear and TiedLinear: when set, computes y = x w^T (+ b) in place of ops::linear, on the
  // input and weight after on_input/on_weight (the fp8 pass's scaled matmuls; fused_loss defers
  // the output projection to the loss); b is the bias when the layer adds it inside (not a
  // Row-split layer's, added after on_output).
  std::function<at::Tensor(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b)> compute;
};

// Layers are built at their local shapes. Initialisation draws the whole tensor from the global
// generator and keeps this rank's piece, one parameter at a time, so every layout holds exactly
// the values of the unsplit model (same seed, same order of draws) and at most one whole
// parameter beyond the rank's pieces is ever held.
class STRATA_API Linear : public torch::nn::Module {
 public:
  // fused: the output is `fused` sections side by side (GPT-2's c_attn: q, k, v), each split on
  // its own, so that a piece holds whole heads of each section.
  Linear(int64_t in, int64_t out, bool bias, ParallelStyle style = ParallelStyle::None, TensorShard shard = {},
         double init_std = 0.02, int64_t fused = 1);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;  // [out, in], or this rank's piece
  at::Tensor bias;    // [out] (its piece when Column), or undefined
  int64_t in_features, out_features;  // of the whole layer
  ParallelStyle parallel_style = ParallelStyle::None;
  TensorShard shard;
  int64_t fused_sections = 1;
  LayerHooks hooks;
  // Zero-bubble pipeline schedules split backward in two: the input gradient, on the critical
  // path, and the weight gradient, run later in a bubble. When set (by the pipeline pass), the
  // layer computes through one autograd node whose backward queues the weight gradient on the
  // thread's WeightGradientQueue, if one is installed, instead of computing it. Only a layer
  // whose weight has no on_weight hook and no compute hook splits.
  bool split_weight_gradient = false;
};

// Weight gradients held back by Linear layers with split_weight_gradient, each a task that
// computes one layer's weight gradient of one backward and adds it to the weight's .grad (no
// gradient hooks run: the pipeline runtime opens the data-parallel sync window itself).
class STRATA_API WeightGradientQueue {
 public:
  // Installs this queue on the calling thread for its lifetime (restoring the previous one).
  class Scope {
   public:
    explicit Scope(WeightGradientQueue* queue);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    WeightGradientQueue* previous_;
  };
  static WeightGradientQueue* current();
  void push(std::function<void()> task) { tasks_.push_back(std::move(task)); }
  size_t size() const { return tasks_.size(); }
  // Runs every queued task, in the order backward queued them, and empties the queue.
  void run_all();

 private:
  std::vector<std::function<void()>> tasks_;
};

class STRATA_API Embedding : public torch::nn::Module {
 public:
  // Column: vocab parallel, this rank holds rows shard_range(count, shard); ids outside them give
  // zero rows, so the sum over the tensor ranks (on_output) is every id's row. Sequence: rows are
  // indexed by token position (learned positions), kept whole.
  Embedding(int64_t count, int64_t dim, ParallelStyle style = ParallelStyle::None, TensorShard shard = {});
  at::Tensor forward(const at::Tensor& ids);
  at::Tensor weight;  // [count, dim], or this rank's rows (Column)
  int64_t count;      // rows of the whole table
  int64_t first_row = 0;  // of this rank's rows
  ParallelStyle parallel_style = ParallelStyle::None;
  TensorShard shard;
  LayerHooks hooks;
};

// The output projection of tied embeddings: x [.., dim] -> logits [.., count] with the
// Embedding's weight (held, not registered: the parameter belongs to the embedding). When the
// embedding is vocab parallel the logits are this rank's vocabulary columns, for a
// vocab-parallel loss.
class STRATA_API TiedLinear : public torch::nn::Module {
 public:
  explicit TiedLinear(std::shared_ptr<Embedding> embedding) : embedding_(std::move(embedding)) {}
  at::Tensor forward(const at::Tensor& x);
  const Embedding& embedding() const { return *embedding_; }
  LayerHooks hooks;

 private:
  std::shared_ptr<Embedding> embedding_;
};

// The experts of a mixture-of-experts layer as one parameter: weight [groups, out, in], each
// group's matrix drawn as a Linear's (normal, std init_std) in group order. forward takes rows
// sorted by group (group_sizes rows each, one per group this rank holds) and computes
// ops::grouped_mm. Its weight decays like a Linear weight. Under tensor parallel every expert
// splits as a Linear does (style Column: out rows, Row: in columns; the whole tensor drawn, this
// rank's piece kept), and the tensor_parallel pass sets hooks.on_input / on_output.
class STRATA_API GroupedLinear : public torch::nn::Module {
 public:
  GroupedLinear(int64_t groups, int64_t in, int64_t out, double init_std = 0.02, ParallelStyle style = ParallelStyle::None,
                TensorShard shard = {});
  at::Tensor forward(const at::Tensor& x, at::IntArrayRef group_sizes);
  // Keeps the groups of piece `shard.index` of `shard.parts` (equal parts): expert parallel.
  // The parameter keeps its identity (its data is replaced), so call it before anything holds
  // views of it; its placement is then a block sharded over Dim::Expert. Under expert parallel
  // core builds the model with each GroupedLinear keeping its groups as it is constructed (the
  // whole tensor drawn, this rank's groups kept); keep_groups with the same shard is then a no-op.
  void keep_groups(TensorShard shard);
  at::Tensor weight;  // [groups, out, in], or this rank's groups (and piece of each)
  int64_t groups, in_features, out_features;  // of the whole layer
  TensorShard expert_shard;
  ParallelStyle parallel_style = ParallelStyle::None;
  TensorShard shard;  // over the tensor ranks
  LayerHooks hooks;   // on_input and on_output are honoured
};

// A mixture-of-experts layer whose experts the expert_parallel pass splits: each rank of `group`
// keeps experts() / group.size() of them and exchanges tokens with the others (all-to-all).
class STRATA_API ExpertParallelLayer {
 public:
  virtual ~ExpertParallelLayer();
  virtual int64_t experts() const = 0;
  virtual void split_experts(Communicator& group) = 0;
};

// A layer that computes statistics over a micro-batch's tokens (a router's load-balancing loss):
// under context parallel each rank holds a part of every window, so context_parallel hands it
// the context group (split_sequence) to make the statistic span the whole window.
class STRATA_API SequenceStatisticsLayer {
 public:
  virtual ~SequenceStatisticsLayer();
  virtual void split_sequence(Communicator& context_group) = 0;
};

// A layer that computes on the whole sequence inside sequence parallel's whole-sequence region
// and whose output every tensor rank computes alike (a mixture-of-experts layer: its router is
// whole, its experts' outputs are summed over the tensor ranks). Under sequence parallel the
// tensor_parallel pass hands it the tensor group (ABI 1.2); the layer then returns this rank's
// tokens of its output (the residual stream is split by tokens, dimension -2) and passes back, of
// the input gradient every rank computes alike, only its tokens' rows: the norm that gathered its
// input sums the ranks' input gradients (a reduce-scatter).
class STRATA_API SequenceParallelLayer {
 public:
  virtual ~SequenceParallelLayer();
  virtual void split_tokens(Communicator& tensor_group) = 0;
};

// ABI 1.3. A SequenceParallelLayer that is also one of these sums its Row-split GroupedLinears'
// partial outputs itself under sequence parallel, by a reduce-scatter to this rank's tokens: half
// the bytes of the all-reduce and cut it replaces. tensor_parallel then leaves the outputs of the
// Row GroupedLinears inside it partial (no hook). The bundled MoE layer is one.
class STRATA_API SumsRowSplitOutputs {
 public:
  virtual ~SumsRowSplitOutputs();
};

// Rows of x exchanged over `group` (a differentiable all-to-all): send_rows[r] consecutive rows
// go to rank r, recv_rows[r] rows come from it, in rank order. Backward sends the gradients back
// the same way.
STRATA_API at::Tensor all_to_all_rows(Communicator& group, const at::Tensor& x, const std::vector<int64_t>& send_rows,
                                      const std::vector<int64_t>& recv_rows);
// x in the forward; its gradient times `factor` in the backward.
STRATA_API at::Tensor scale_gradient(const at::Tensor& x, double factor);

// Losses a layer adds to the training objective where it computes them (a mixture-of-experts
// router's load-balancing and z losses), without passing them to the end of the model: the layer
// returns add_auxiliary_loss(output, loss), which is `output` in the forward, and whose backward
// also differentiates `loss` with the weight the micro-batch loss has in this backward
// (LossGradientScale), as if `loss` were added to that micro-batch's loss. So it works on every
// pipeline stage and under recomputation (activation checkpointing), and the reported loss stays
// the language-model loss. A scalar `loss`; its value is not reported here (the layer reports it).
STRATA_API at::Tensor add_auxiliary_loss(const at::Tensor& output, const at::Tensor& loss);
// The weight of a micro-batch's loss in the backward running now: the step runs backward on
// loss * scale (amp's loss scale / micro-batches per step) and sets this around it, process-wide
// (CUDA's autograd runs on its own threads). 1 outside a backward.
class STRATA_API LossGradientScale {
 public:
  explicit LossGradientScale(double scale);
  ~LossGradientScale();
  LossGradientScale(const LossGradientScale&) = delete;
  LossGradientScale& operator=(const LossGradientScale&) = delete;
  static double current();

 private:
  double previous_;
};

// Norms: style Sequence for a norm on the residual stream whose output feeds Column layers (all
// of the bundled models' norms); None for any other.
class STRATA_API LayerNorm : public torch::nn::Module {
 public:
  LayerNorm(int64_t dim, bool bias, double eps = 1e-5, ParallelStyle style = ParallelStyle::None);
  at::Tensor forward(const at::Tensor& x);
  // A pre-norm residual step: {residual + x, forward(residual + x)} through the add_layer_norm
  // operator (ops.h), the hooks applied as forward() applies them; with an on_input hook, the add
  // and then forward(). ABI 1.5.
  ops::AddNormResult forward_residual(const at::Tensor& residual, const at::Tensor& x);
  at::Tensor weight, bias;
  double eps;
  ParallelStyle parallel_style = ParallelStyle::None;
  LayerHooks hooks;
};

class STRATA_API RmsNorm : public torch::nn::Module {
 public:
  RmsNorm(int64_t dim, double eps, ParallelStyle style = ParallelStyle::None);
  at::Tensor forward(const at::Tensor& x);
  // As LayerNorm::forward_residual, through add_rms_norm. ABI 1.5.
  ops::AddNormResult forward_residual(const at::Tensor& residual, const at::Tensor& x);
  at::Tensor weight;
  double eps;
  ParallelStyle parallel_style = ParallelStyle::None;
  LayerHooks hooks;
};

// Where the tokens of the running micro-batch sit in their training window, for the layers that
// depend on it: position embeddings and RoPE (positions), causal masking (token_index) and packed
// documents (documents). Core derives it from the batch ([data] document_end, reset_positions);
// context parallel narrows it to this rank's tokens. Undefined members mean the plain case.
struct STRATA_API SequenceLayout {
  int64_t window = 0;      // tokens of the whole window; 0: the activation's own length
  at::Tensor token_index;  // [T] int64 window position of each token this rank holds; undefined: 0..T-1
  at::Tensor positions;    // [B, T] int64 position ids (restarting per document); undefined: token_index
  at::Tensor documents;    // [B, window] int64 document id of every token of the window; undefined: one document
  // Position ids of this rank's T tokens: positions, else token_index, else 0..T-1 ([T] or [B, T]).
  at::Tensor position_ids(int64_t t, const at::Device& device) const;
  // Window positions of this rank's T tokens.
  at::Tensor index(int64_t t, const at::Device& device) const;
  // Document ids of this rank's tokens [B, T], or undefined.
  at::Tensor local_documents() const;
};

// The layout of a whole window of packed documents, inputs [B, T]: every token's document id
// (an end token belongs to the document it ends; the next token starts a new one) and, with
// reset_positions, positions counted from each document's first token. document_end < 0: one
// document per window (the plain layout).
STRATA_API SequenceLayout packed_sequence(const at::Tensor& inputs, int64_t document_end, bool reset_positions);

// Installs a layout on the calling thread for its lifetime (restoring the previous one): the
// trainer around each micro-batch's forward, activation checkpointing around a recomputation.
class STRATA_API SequenceScope {
 public:
  explicit SequenceScope(SequenceLayout layout);
  ~SequenceScope();
  SequenceScope(const SequenceScope&) = delete;
  SequenceScope& operator=(const SequenceScope&) = delete;

 private:
  SequenceLayout previous_;
};
// The layout installed on this thread (an empty one, the plain case, when none is).
STRATA_API const SequenceLayout& current_sequence();

// The attention of a layer on q, k, v [B, H, T, D] (k, v may have fewer heads) under the current
// sequence layout: causal by window position, never across documents. Context parallel sets
// `attend` to compute over a sequence split across ranks; unset, ops::attention computes it.
class STRATA_API AttentionCore : public torch::nn::Module {
 public:
  explicit AttentionCore(bool causal, int64_t sliding_window = 0) : causal(causal), sliding_window(sliding_window) {}
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
  bool causal;
  int64_t sliding_window;  // ops::AttentionMask::sliding_window: each query's most recent keys; 0: all
  // Receives this rank's q, k, v and the mask of its own tokens (the layout has the rest).
  std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ops::AttentionMask& local)> attend;
};

// Dropout (at::dropout's masks) that also runs on a sequence-split activation [.., T/parts, d]:
// with `sequence_shard.parts` > 1 it draws the mask of the whole sequence [.., T, d] from the
// generator (on CPU exactly the mask at::dropout draws for the whole activation; CUDA's
// at::dropout is a fused kernel, so there the masks differ from it but not between layouts), and
// keeps this rank's tokens. So under sequence parallel every tensor rank applies its rows of the
// single-process mask and the generators of the tensor group stay in step (the rule that keeps
// replicated-region masks identical across the group). Under context parallel (the current
// sequence layout holds fewer tokens than its window) the mask is drawn for the whole window and
// this rank's tokens' rows are kept, the same way.
class STRATA_API Dropout : public torch::nn::Module {
 public:
  explicit Dropout(double p) : p(p) {}
  at::Tensor forward(const at::Tensor& x);
  double p;
  TensorShard sequence_shard;  // set by sequence parallel
};

// Random numbers keyed by micro-batch: the rule that lets a pipeline draw one process's dropout
// masks. Inside a scope (core's forward-backward and the pipeline runtime open one per training
// micro-batch), Model::forward_blocks seeds the generators before each block from (seed, step,
// micro-batch, data rank, block name) and puts them back after it. A block's masks then depend
// on which micro-batch of which step it computes, not on which rank runs it nor in what order a
// schedule runs the micro-batches, and the job's own generator stream (data order, the
// checkpointed "rng" state) is not advanced by dropout. Recomputation (act_checkpoint captures
// the seeded state) and WSAM's second pass (it opens the same scope) draw the same masks again.
// Tensor and context ranks share the data rank, so they draw alike, as they must; data ranks
// differ, so their masks do too. Without a scope (evaluation, a program calling forward itself)
// blocks draw from the generators as they stand.
class STRATA_API MicroBatchRandomness {
 public:
  MicroBatchRandomness(uint64_t seed, int64_t step, int64_t micro, int64_t data_rank);
  ~MicroBatchRandomness();
  MicroBatchRandomness(const MicroBatchRandomness&) = delete;
  MicroBatchRandomness& operator=(const MicroBatchRandomness&) = delete;
  // The innermost scope open on this thread, or null.
  static const MicroBatchRandomness* current();
  // The seed of the draws of block `name` in this micro-batch.
  uint64_t block_seed(const std::string& name) const;

 private:
  uint64_t key_;
  const MicroBatchRandomness* outer_;
};

// ABI 1.3. While one is alive on this thread, MicroBatchRandomness scopes seed nothing: blocks
// draw from the generators as they stand, as without a scope. For work recorded once and replayed
// (the cuda_graph pass records the gradients as a CUDA graph), where a generator may not be
// reseeded mid-capture; such a pass refuses models that draw (dropout > 0) at plan time, and a
// draw from an unregistered generator inside a capture fails the capture.
class STRATA_API UnkeyedRandomness {
 public:
  UnkeyedRandomness();
  ~UnkeyedRandomness();
  UnkeyedRandomness(const UnkeyedRandomness&) = delete;
  UnkeyedRandomness& operator=(const UnkeyedRandomness&) = delete;

 private:
  bool outer_;
};

// A module that keeps per-step figures (a router's expert loads): report_metrics appends
// name/value pairs for the training micro-batches since its last call, on this rank and its
// blocks, and starts counting again. Several modules may report one name: the model sums them,
// and under a pipeline core sums them over the stages too (each holds some of the modules), so a
// figure must be a sum over modules (a mean is reported as each module's share of it).
class STRATA_API ReportsMetrics {
 public:
  virtual ~ReportsMetrics();
  virtual void report_metrics(std::vector<std::pair<std::string, double>>& out) = 0;
};

// The same for figures still on the device (ABI 1.2): report_device_metrics appends name /
// one-element tensor pairs, and core reads them with the step's loss, only on steps that record
// figures (StepProgram::report_device_figure), so the module reads nothing to the host for them
// (a router's balance losses: a read in each forward would wait for the device's queue).
// Core calls it after collect_metrics, every step; several modules may report one name (summed).
class STRATA_API ReportsDeviceMetrics {
 public:
  virtual ~ReportsDeviceMetrics();
  virtual void report_device_metrics(std::vector<std::pair<std::string, at::Tensor>>& out) = 0;
};

// A module whose state follows the training (not the gradient): after each optimizer step core
// calls after_optimizer_step with the ranks that hold the same layers and see other tokens (data
// x context, so expert ranks too; one group per pipeline stage), collectively, in module order.
// DeepSeek-V3's router bias moves with the expert loads summed over those ranks. Such state
// lives in buffers (register_buffer), which checkpoints carry as the "buffers" state.
class STRATA_API AdjustsAfterStep {
 public:
  virtual ~AdjustsAfterStep();
  virtual void after_optimizer_step(Communicator& token_ranks) = 0;
};

// A block: the unit passes address by name and by type ("embedding", "block", "head", ...).
class STRATA_API Block : public torch::nn::Module {
 public:
  explicit Block(std::string type) : type_(std::move(type)) {}
  ~Block() override;
  const std::string& type() const { return type_; }
  virtual at::Tensor forward(const at::Tensor& x) = 0;

 private:
  std::string type_;
};

// A parameter of a block as an outline knows it: its name within the block, its shape at this
// rank (a tensor-parallel piece's), and whether it trains.
struct ParameterShape {
  std::string name;
  std::vector<int64_t> shape;
  bool trains = true;
};

// What stands in for a block this rank does not build (Model::add_block under a BlockFilter): the
// name and type stay, so partitions and selectors see the whole model, while its parameters are
// gone; their names and shapes are kept. Running it is an error.
class STRATA_API AbsentBlock final : public Block {
 public:
  AbsentBlock(std::string type, std::vector<ParameterShape> parameters, bool reads_tied_weight);
  ~AbsentBlock() override;
  at::Tensor forward(const at::Tensor& x) override;
  int64_t parameter_count() const;
  const std::vector<ParameterShape>& parameter_shapes() const { return parameters_; }
  // Whether the block read a weight another block owns (a TiedLinear head).
  bool reads_tied_weight() const { return reads_tied_weight_; }

 private:
  std::vector<ParameterShape> parameters_;
  bool reads_tied_weight_;
};

// While alive on this thread, Model::add_block keeps the blocks `keep` accepts (by index in the
// model) and replaces the others by an AbsentBlock the moment they are added, so a model factory
// that adds blocks as it builds them holds one foreign block at a time. The factory still builds
// every block in order, so the kept blocks draw exactly the values of the whole model (the
// generators move as if nothing were dropped). A pipeline rank's start-up memory is its stages'.
class STRATA_API BlockFilter {
 public:
  explicit BlockFilter(std::function<bool(size_t index)> keep);
  ~BlockFilter();
  BlockFilter(const BlockFilter&) = delete;
  BlockFilter& operator=(const BlockFilter&) = delete;

 private:
  const std::function<bool(size_t)>* outer_;
  std::function<bool(size_t)> keep_;
};

// What a sharding pass does with each block the moment the factory has built it (Model::add_block
// calls `built` for every block it keeps while a KeepAtBuild scope is alive on this thread): keep
// this rank's part of the block's values and let the rest go, so that building a model holds this
// rank's shards plus one whole block, never the whole model (Pass::keeper_at_build). A factory
// may install one of its own inside the pass's scope: scopes nest, and every live keeper sees
// each block, the innermost first, so a factory that fills each block from a checkpoint
// ([model] init_from) does so before the sharding pass keeps its part.
class STRATA_API BuildKeeper {
 public:
  virtual ~BuildKeeper();
  virtual void built(size_t index, const std::string& name, Block& block) = 0;
  // One line for the rank log: what was kept, "fsdp kept 1/4 of 12345 parameters".
  virtual std::string summary() const = 0;
};

// What a keeper leaves in place of a parameter it let go: the parameter's shape, dtype and device
// over one NaN element (stride 0), so shapes, dtype casts and module moves work on it while it
// holds nothing; its values are the sharding pass's to provide.
STRATA_API at::Tensor placeholder(at::IntArrayRef sizes, const at::TensorOptions& options);
STRATA_API bool is_placeholder(const at::Tensor& t);

class STRATA_API KeepAtBuild {
 public:
  explicit KeepAtBuild(BuildKeeper* keeper);
  ~KeepAtBuild();
  KeepAtBuild(const KeepAtBuild&) = delete;
  KeepAtBuild& operator=(const KeepAtBuild&) = delete;

 private:
  BuildKeeper* outer_;
};

class Model;
// The parameters of block `index` of `model`, also when it is absent.
STRATA_API int64_t block_parameter_count(const Model& model, size_t index);
// The names, shapes and trainability of block `index`'s parameters, also when it is absent.
STRATA_API std::vector<ParameterShape> block_parameter_shapes(const Model& model, size_t index);
// Whether block `index` reads a weight another block owns (holds a TiedLinear), also when absent.
STRATA_API bool block_reads_tied_weight(const Model& model, size_t index);

// How a block is run; passes replace it to wrap the call (gather parameters, recompute, ...).
using BlockExecutor = std::function<at::Tensor(Block& block, const at::Tensor& x)>;
// Pre-forward hooks receive the block's input, post-forward hooks its output.
using BlockHook = std::function<void(Block& block, const at::Tensor& x)>;

}  // namespace strata::nn

namespace strata::detail {
struct ModelState;  // nn::Model's state, defined in core
}  // namespace strata::detail

namespace strata::nn {

class STRATA_API Model : public torch::nn::Module {
 public:
  Model(int64_t vocab_size, int64_t seq_len);
  ~Model() override;

  void add_block(const std::string& name, std::shared_ptr<Block> block);
  size_t num_blocks() const;
  Block& block(size_t i) const;
  const std::string& block_name(size_t i) const;
  // Blocks whose type or name is in `selectors`, in model order.
  std::vector<size_t> find_blocks(const std::vector<std::string>& selectors) const;

  void set_executor(size_t i, BlockExecutor executor);
  void add_pre_forward_hook(size_t i, BlockHook hook);
  void add_post_forward_hook(size_t i, BlockHook hook);

  // Declares a parameter that blocks other than its owner also read (tied weights), so passes
  // that free a block's parameters between uses (fsdp) keep it.
  void mark_shared(const std::string& parameter_name);
  const std::vector<std::string>& shared_parameters() const;

  // tokens [B, T] int64 -> logits [B, T, vocab]
  at::Tensor forward(const at::Tensor& tokens);
  // Blocks [first, last) on x, with their executors and hooks: a pipeline stage's chunk, which
  // starts from tokens when it holds the embedding and from an activation otherwise. In training
  // and inside a MicroBatchRandomness scope, each block draws from generators seeded for it.
  at::Tensor forward_blocks(size_t first, size_t last, const at::Tensor& x);
  // Keeps only the blocks at `indices` (ascending) and drops the others and their parameters: a
  // pipeline stage's model. Parameter names do not change. Call before any pass hooks blocks.
  void keep_blocks(const std::vector<size_t>& indices);

  int64_t vocab_size() const;
  int64_t seq_len() const;
  // Parameters that weight decay applies to by default: Linear and GroupedLinear weights only (not norms, biases
  // or embeddings). A tied parameter counts as what it was first registered as.
  std::vector<std::string> decayed_parameter_names() const;

  // Training FLOPs per token, nanoGPT/PaLM style: 6 N + 12 L H Q T, N the parameter count less
  // the parameters a token does not use (a mixture of experts' unchosen experts).
  void set_attention_shape(int64_t layers, int64_t heads, int64_t head_dim);
  void set_inactive_parameters(double count);
  double training_flops_per_token() const;

  // The step's figures of every module that reports some (ReportsMetrics), in module order,
  // values of one name summed over the modules. Core appends them to the step's metrics after
  // each optimizer step.
  void collect_metrics(std::vector<std::pair<std::string, double>>& out) const;
  // Every AdjustsAfterStep module's after_optimizer_step, in module order (collective over
  // `token_ranks`). Core calls it after each optimizer step, before collect_metrics.
  void after_optimizer_step(Communicator& token_ranks);

 private:
  // Blocks, hooks and sizes live in core (one pointer here): the size never changes.
  std::unique_ptr<detail::ModelState> state_;
};

// Placements of the parameters split over the tensor-parallel ranks, by name as
// Model::named_parameters gives them: weights of split layers and the biases of Column-split ones
// (a Row-split layer's bias is whole on every rank), each a block of the whole tensor sharded
// over Dim::Tensor, and the experts an expert-parallel GroupedLinear keeps, sharded over
// Dim::Expert. Parameters without an entry are whole.
STRATA_API Placements parameter_placements(const Model& model);
// The same for one block, named relative to it ("attn.c_attn.weight"): what a BuildKeeper needs.
// For an AbsentBlock, the placements its parameters had when the factory built it (a model
// outline's absent blocks say which parameters a rank holds a piece of, and which piece).
STRATA_API Placements parameter_placements(const Block& block);

}  // namespace strata::nn
