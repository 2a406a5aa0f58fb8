// The communicator ABI: collectives and point-to-point messages between ranks, all
// asynchronous. Backends (mpi, nccl) are plugins; process groups come from core's topology.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "strata/component.h"

namespace strata {

enum class ReduceOp { Sum, Avg, Max, Min };

// A pending operation. Tensors it writes must not be read, and tensors it reads must not be
// written, until wait() returns. Errors surface from wait().
class STRATA_API Work {
 public:
  virtual ~Work();
  virtual void wait() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// One point-to-point message of a batch (Communicator::batch_p2p).
struct P2POp {
  enum class Kind { Send, Recv };
  Kind kind;
  at::Tensor tensor;
  int peer;
  int tag = 0;
};

// Ranks here are ranks within this communicator's group. fp16 and bf16 are reduced with fp32
// accumulation. Operations are queued in call order; every rank of the group must issue the
// same collectives in the same order.
class STRATA_API Communicator {
 public:
  virtual ~Communicator();
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual WorkPtr all_reduce(at::Tensor tensor, ReduceOp op) = 0;
  // input: size() equal chunks along dim 0 (flattened); output receives this rank's reduced chunk.
  virtual WorkPtr reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op) = 0;
  // output: size() chunks of input's size, in rank order.
  virtual WorkPtr all_gather(at::Tensor output, at::Tensor input) = 0;
  virtual WorkPtr broadcast(at::Tensor tensor, int root) = 0;
  // Splits are element counts of the flattened tensors per rank; empty means equal splits.
  virtual WorkPtr all_to_all(at::Tensor output, at::Tensor input, std::vector<int64_t> output_splits,
                             std::vector<int64_t> input_splits) = 0;
  // Point-to-point messages are posted at once and complete in the background: sends and
  // receives between two ranks complete whatever order each rank issues them in (a pipeline
  // sends activations one way while gradients come back the other). A message matches the one
  // with the same peer and tag (0 to 32766); between one pair of ranks, messages with equal tags
  // match in issue order (nccl has no tags and matches in issue order only). Sizes are 64-bit.
  virtual WorkPtr send(at::Tensor tensor, int peer, int tag) = 0;
  virtual WorkPtr recv(at::Tensor tensor, int peer, int tag) = 0;
  // Posts every message of the batch together; one Work waits for all of them. nccl needs this
  // form (a group) for exchanges in both directions.
  virtual WorkPtr batch_p2p(std::vector<P2POp> ops) = 0;
  virtual WorkPtr barrier() = 0;

  // A communicator over `ranks` (ranks of this communicator, ascending); collective over this
  // communicator: every rank calls it with its own group, groups partition the ranks.
  virtual std::shared_ptr<Communicator> split(const std::vector<int>& ranks) = 0;
};

class STRATA_API CommunicatorBackend : public Component {
 public:
  using Component::Component;
  ~CommunicatorBackend() override;
  // The communicator over all ranks of this job; called once per process. `bootstrap` is a
  // working communicator over the same ranks (the mpi backend's, or a one-rank local one) for
  // backends that need to exchange setup data; the mpi backend ignores it.
  virtual std::shared_ptr<Communicator> world(Communicator& bootstrap) const = 0;
};

}  // namespace strata
