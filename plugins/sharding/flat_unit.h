// A flat unit: parameters laid end to end in one flat buffer, padded to a multiple of the
// data-parallel group size, so that rank r owns chunk r of it. zero1, zero2 and fsdp are all
// built from units; they differ in how gradients are reduced and whether full parameters stay
// allocated between uses.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "strata/comm.h"
#include "strata/optimizer.h"
#include "strata/placement.h"

namespace strata::sharding {

enum class GradReduce {
  AllReduce,      // every rank keeps the whole averaged gradient (zero1)
  ReduceScatter,  // every rank keeps only its chunk of it (zero2, fsdp)
};

// Dtypes a unit works in besides its parameters' own (the master weights the optimizer updates).
struct UnitDtypes {
  // Full parameters, and so the forward, backward and gradients (units that gather before use).
  std::optional<at::ScalarType> gather;
  // Gradient communication; unset: the gradients' dtype.
  std::optional<at::ScalarType> reduce;
};

// The part of one parameter that lies in this rank's chunk.
struct Piece {
  std::string name;
  at::Tensor data;  // view of this rank's parameter chunk; undefined when the chunk holds none of it
  at::Tensor grad;  // the same view of the gradient chunk
  Placement placement;  // where `data` sits in the whole parameter; sharded over the data ranks
};

// Bytes a pass's collectives moved: `full`, the sizes of the buffers each all-gather filled and
// each reduction sent (the passes' *_gather_bytes and *_reduce_bytes metrics), and `sent`, what
// this rank sent of them as ring algorithms send over a unit's g ranks: (g-1)/g of an all-gather
// or reduce-scatter, twice that of an all-reduce (the *_sent_bytes metrics; what tune's
// comm_bytes predicts).
struct Traffic {
  int64_t full = 0;
  double sent = 0;
  Traffic& operator+=(const Traffic& other) {
    full += other.full, sent += other.sent;
    return *this;
  }
};

class FlatUnit {
 public:
  // Moves the parameters' data into the unit's flat buffer (they become views of it). With
  // `persistent_params` false (fsdp) this rank keeps its chunk apart, in the parameters' dtype,
  // and the full buffer, in dtypes.gather, is freed until gather() is called. Persistent units
  // and AllReduce units keep parameters in their own dtype.
  FlatUnit(std::string name, std::vector<std::pair<std::string, at::Tensor>> params, Communicator& comm,
           GradReduce reduce, bool persistent_params, UnitDtypes dtypes = {});
  // A unit whose parameters were let go as the model was built (fsdp's sharded initialisation):
  // the parameters are placeholders of their shape (nn::placeholder), `kept_chunk` is this
  // rank's chunk of the flat buffer, in the master dtype on the job's device, as the keeper
  // assembled it. Reduce-scatters, gathers before use, starts released.
  FlatUnit(std::string name, std::vector<std::pair<std::string, at::Tensor>> params, Communicator& comm, at::Tensor kept_chunk,
           UnitDtypes dtypes = {});

  // Hybrid sharding (HSDP): `comm` is one of several shard groups of `group_data_ranks`
  // contiguous data ranks (or, for split experts, the ranks of one such group holding the same
  // experts), and `replicas` the ranks of the other groups that hold the same chunk. Gradients
  // reduced within the shard group are then averaged over `replicas`; pieces are placed as
  // sharded over groups of `group_data_ranks` data ranks. Called right after construction,
  // before any use.
  void replicate_across(Communicator& replicas, int64_t group_data_ranks);

  const std::string& name() const { return name_; }
  const std::vector<std::pair<std::string, at::Tensor>>& params() const { return params_; }
  int64_t numel() const { return numel_; }
  bool reduce_scatters() const { return reduce_ == GradReduce::ReduceScatter; }
  // Size of the full buffer each all-gather fills and each gradient reduction sends.
  int64_t gather_bytes() const;
  int64_t reduce_bytes() const;
  // Size of the chunk each reduction averages over the replicas (HSDP), else 0.
  int64_t replica_reduce_bytes() const;
  // One all-gather, and one gradient reduction (`final`: with the average over the replicas).
  Traffic gather_traffic() const;
  Traffic reduce_traffic(bool final) const;

  // Full parameters (fsdp): start_gather() launches the all-gather into a freshly allocated
  // buffer, wait_gathered() completes it, release() frees the buffer.
  bool gathered() const { return state_ != State::Released; }
  bool gathering() const { return state_ == State::Gathering; }
  void start_gather();
  void wait_gathered();
  void release();

  // A change of this rank's full parameters that the chunks do not carry (Job's
  // offset_full_parameters; WSAM's local perturbation): `offsets` by parameter name, in the
  // parameters' shapes, absent names unchanged. A unit that gathers before use lets its full
  // parameters go now and adds the offsets to every later gather; a persistent one adds them at
  // once and, when they are cleared (called with none), takes back the exact values it had.
  // Called outside forward and backward.
  void set_full_offsets(const NamedTensors& offsets);

  // Gradients: count parameters whose gradient is final in this backward; the last one makes
  // the unit complete.
  void begin_backward();
  bool mark_ready(size_t param_index);
  bool complete() const { return pending_ == 0; }
  // Names of the parameters that got no gradient in this backward so far.
  std::vector<std::string> missing_gradients() const;
  // Gives parameters without a gradient a zero one, so the unit can be reduced.
  void fill_missing_gradients();
  // Launches the reduction of the parameters' (accumulated) gradients; ReduceScatter frees them.
  // A reduction that is not `final` (ReduceScatter only: fsdp's reduce_every_micro_batch) is one
  // micro-batch's share: its chunk is added to the gradient chunk, which sums the step's shares;
  // the final one adds the last share and (HSDP) averages the sum over the replicas. A parameter
  // whose gradient is absent (already reduced, or a weight gradient still held back) adds zero.
  // An earlier reduction of this unit still in flight completes first.
  void start_reduce(bool final = true);
  // HSDP: waits for the reduction within the shard group and launches the average over the
  // replicas (a second collective on another communicator must not start before the first has
  // filled its input); nothing otherwise. wait_reduced() calls it when it has not run.
  void start_replica_reduce();
  // Completes it; AllReduce makes each parameter's .grad() a view of the averaged buffer.
  void wait_reduced();

  // The gradient buffer (AllReduce: the full averaged gradients; ReduceScatter: this rank's
  // chunk) lives for one step, as the gradients it holds do: released before a step's first
  // forward, allocated as backward reaches the unit, so no pass holds gradients through the
  // forward that one process would not. Views of it (pieces, .grad) stay valid objects across.
  void release_gradients();
  // AllReduce only, as each parameter's gradient is final in a backward (PyTorch DDP's
  // gradient_as_bucket_view): the gradient autograd made is moved into its place in the buffer
  // and the parameter's .grad() becomes that view, so later micro-batches accumulate in place
  // and the full gradients exist once, not once in autograd's tensors and again in the buffer.
  void adopt_gradient(size_t param_index);

  // This rank's chunk of the gradient, what the optimizer applies.
  at::Tensor grad_chunk() const;
  // Where the optimizer updates parameters: views of this rank's chunk.
  const std::vector<Piece>& pieces() const { return pieces_; }
  // Places the pieces of parameters that are themselves pieces (a tensor-parallel layer's shard,
  // placed as `parameter_placements` says) within the whole tensor: the flat shard nests in the
  // block.
  void nest_pieces_in(const Placements& parameter_placements);
  // After the optimizer (or a checkpoint) changed this rank's chunk: all-gather it into the full
  // parameters that persist (zero1, zero2). Units that gather before use need nothing.
  WorkPtr start_refresh();

 private:
  enum class State { Released, Gathering, Gathered };
  at::Tensor data_chunk() const;
  void lay_out();      // offsets_, numel_, padded_, chunk_, chunk_begin_
  void make_pieces();  // pieces_ over the data and gradient chunks
  void add_full_offsets();  // full_offsets_ into the full buffer
  at::Tensor& gradient_buffer() { return reduce_ == GradReduce::AllReduce ? full_grad_ : grad_chunk_; }
  void allocate_gradients();  // the gradient buffer's storage, when released

  std::string name_;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::vector<int64_t> offsets_;
  Communicator& comm_;
  Communicator* replicas_ = nullptr;  // HSDP's replica group, or none
  bool replica_reduce_started_ = false;
  bool final_ = true;                 // of the reduction in flight
  bool chunk_holds_shares_ = false;   // grad_chunk_ sums this step's earlier (not final) reductions
  GradReduce reduce_;
  bool persistent_;
  at::ScalarType master_dtype_, gather_dtype_, reduce_dtype_;
  int64_t numel_ = 0, padded_ = 0, chunk_ = 0, chunk_begin_ = 0;
  at::Tensor full_;          // [padded], gather dtype: the parameters are views of it
  at::Tensor shard_;         // [chunk], master dtype: this rank's parameters when they do not persist
  at::Tensor gather_input_;  // shard_ in the gather dtype while an all-gather reads it
  at::Tensor full_grad_;     // [padded], master dtype: AllReduce's gradients (adopted, then averaged); one step's life
  at::Tensor grad_chunk_;    // [chunk], master dtype: ReduceScatter's result; one step's life
  at::Tensor staging_;       // [padded], reduce dtype: the gradients a reduction sends
  at::Tensor reduced_;       // [chunk], reduce dtype: what a reduce-scatter receives
  std::vector<Piece> pieces_;
  std::vector<at::Tensor> full_offsets_;  // by parameter, flat; empty (or undefined entries) when none
  at::Tensor unoffset_;                   // a persistent unit's full buffer before its offsets were added
  State state_ = State::Gathered;
  bool gradients_released_ = false;
  WorkPtr gather_work_, reduce_work_;
  std::vector<bool> ready_;
  size_t pending_ = 0;
};

}  // namespace strata::sharding
