// The c10d communicator backend: libtorch's own distributed library, so ranks started by
// torchrun (or torchelastic, dlrover-run, a Kubeflow PyTorchJob: anything that sets RANK,
// WORLD_SIZE, MASTER_ADDR and MASTER_PORT) find each other without MPI. Ranks srun or mpirun
// started use it too, given MASTER_ADDR and MASTER_PORT: core sets RANK and WORLD_SIZE for them
// from their launcher's variables (export_torchrun_env).
//
// Rendezvous is a c10d TCPStore at MASTER_ADDR:MASTER_PORT. Under torchrun the elastic agent
// already serves that store (TORCHELASTIC_USE_AGENT_STORE), so every rank joins as a client;
// otherwise rank 0 serves it. Keys live under "strata/<restart>/" so that a restarted worker
// group (TORCHELASTIC_RESTART_COUNT) never reads its predecessor's. Collectives run on
// ProcessGroupGloo, host tensors; a group of ranks (split) is a further ProcessGroupGloo over the
// same store under a prefix every member derives alike (the n-th split of this communicator, the
// group's first rank). Half-precision sums accumulate in fp32 (gloo reduces in the tensor's own
// type); Avg is a Sum divided by the group size (gloo has no average).
#include <cstdlib>
#include <string>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "strata/plugin.h"

namespace strata::comm_c10d {
namespace {

using Gloo = c10d::ProcessGroupGloo;

bool half_precision(const at::Tensor& t) { return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16; }

c10d::ReduceOp c10d_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return c10d::ReduceOp::SUM;
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

void require_host(const at::Tensor& t) {
  if (!t.device().is_cpu())
    throw UserError("the c10d communicator moves host tensors only (gloo); use the nccl backend for " + t.device().str() + " tensors");
}

// A c10d operation, and what to do once it is complete: copy a result back into the caller's
// tensor (fp32 accumulation buffers, non-contiguous outputs), divide for an average.
class C10dWork final : public Work {
 public:
  C10dWork(c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish = {}) : work_(std::move(work)), finish_(std::move(finish)) {}
  // An operation nobody waited for still completes before the tensors it holds are released.
  ~C10dWork() override {
    try {
      wait();
    } catch (...) {
    }
  }
  void wait() override {
    if (done_) return;
    done_ = true;
    if (work_) work_->wait();
    work_.reset();
    if (finish_) finish_();
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> finish_;  // (a batch's: wait for each of its messages)
  bool done_ = false;
};

class C10dCommunicator final : public Communicator {
 public:
  C10dCommunicator(c10::intrusive_ptr<c10d::Store> store, int rank, int size) : store_(std::move(store)) {
    auto options = Gloo::Options::create();
    options->devices.push_back(Gloo::createDefaultDevice());
    group_ = c10::make_intrusive<Gloo>(store_, rank, size, options);
  }
  int rank() const override { return group_->getRank(); }
  int size() const override { return group_->getSize(); }

  WorkPtr all_reduce(at::Tensor tensor, ReduceOp op) override {
    require_host(tensor);
    at::Tensor work = half_precision(tensor) || !tensor.is_contiguous() ? tensor.to(half_precision(tensor) ? at::kFloat : tensor.scalar_type()).contiguous() : tensor;
    std::vector<at::Tensor> tensors{work};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d_op(op);
    auto pending = group_->allreduce(tensors, options);
    return std::make_shared<C10dWork>(pending, [tensor, work, op, n = size()]() mutable {
      if (op == ReduceOp::Avg) work.div_(n);
      if (!work.is_same(tensor)) tensor.copy_(work);
    });
  }

  // Gloo's reduce-scatter is a list form; an all-reduce of the whole input, keeping this rank's
  // chunk, moves more bytes but gives the same sums in the same order on every rank.
  WorkPtr reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op) override {
    require_host(input);
    at::Tensor whole = input.to(half_precision(input) ? at::kFloat : input.scalar_type()).contiguous().clone();
    std::vector<at::Tensor> tensors{whole};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d_op(op);
    auto pending = group_->allreduce(tensors, options);
    return std::make_shared<C10dWork>(pending, [output, whole, op, n = size(), r = rank()]() mutable {
      at::Tensor mine = whole.reshape(-1).chunk(n)[static_cast<size_t>(r)];
      if (op == ReduceOp::Avg) mine.div_(n);
      output.copy_(mine.view(output.sizes()));
    });
  }

  WorkPtr all_gather(at::Tensor output, at::Tensor input) override {
    require_host(input);
    at::Tensor out = output.is_contiguous() ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
    at::Tensor in = input.contiguous();
    auto pending = group_->_allgather_base(out, in);
    return std::make_shared<C10dWork>(pending, [output, out, in]() mutable {
      if (!out.is_same(output)) output.copy_(out);
    });
  }

  WorkPtr broadcast(at::Tensor tensor, int root) override {
    require_host(tensor);
    at::Tensor work = tensor.contiguous();
    std::vector<at::Tensor> tensors{work};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    auto pending = group_->broadcast(tensors, options);
    return std::make_shared<C10dWork>(pending, [tensor, work]() mutable {
      if (!work.is_same(tensor)) tensor.copy_(work);
    });
  }

  WorkPtr all_to_all(at::Tensor output, at::Tensor input, std::vector<int64_t> output_splits, std::vector<int64_t> input_splits) override {
    require_host(input);
    // Splits are element counts of the flattened tensors: gloo splits along dim 0 of these.
    at::Tensor out = output.is_contiguous() ? output.view(-1) : at::empty({output.numel()}, output.options());
    at::Tensor in = input.contiguous().view(-1);
    auto pending = group_->alltoall_base(out, in, output_splits, input_splits);
    return std::make_shared<C10dWork>(pending, [output, out, in]() mutable {
      if (out.data_ptr() != output.data_ptr()) output.copy_(out.view(output.sizes()));
    });
  }

  WorkPtr send(at::Tensor tensor, int peer, int tag) override {
    require_host(tensor);
    std::vector<at::Tensor> tensors{tensor.contiguous()};
    return std::make_shared<C10dWork>(group_->send(tensors, peer, tag), [tensors] {});
  }

  WorkPtr recv(at::Tensor tensor, int peer, int tag) override {
    require_host(tensor);
    at::Tensor work = tensor.contiguous();
    std::vector<at::Tensor> tensors{work};
    auto pending = group_->recv(tensors, peer, tag);
    return std::make_shared<C10dWork>(pending, [tensor, work]() mutable {
      if (!work.is_same(tensor)) tensor.copy_(work);
    });
  }

  WorkPtr batch_p2p(std::vector<P2POp> ops) override {
    auto all = std::make_shared<std::vector<WorkPtr>>();
    for (auto& op : ops) all->push_back(op.kind == P2POp::Kind::Send ? send(op.tensor, op.peer, op.tag) : recv(op.tensor, op.peer, op.tag));
    return std::make_shared<C10dWork>(c10::intrusive_ptr<c10d::Work>(), [all] {
      for (auto& w : *all) w->wait();
    });
  }

  WorkPtr barrier() override { return std::make_shared<C10dWork>(group_->barrier()); }

  std::shared_ptr<Communicator> split(const std::vector<int>& ranks) override {
    const int index = splits_++;
    const auto mine = std::find(ranks.begin(), ranks.end(), rank());
    if (mine == ranks.end()) throw std::logic_error("c10d split: this rank is not in its own group");
    auto prefix = c10::make_intrusive<c10d::PrefixStore>("split" + std::to_string(index) + "_" + std::to_string(ranks.front()), store_);
    return std::make_shared<C10dCommunicator>(prefix, static_cast<int>(mine - ranks.begin()), static_cast<int>(ranks.size()));
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<Gloo> group_;
  int splits_ = 0;
};

std::string required_env(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value)
    throw UserError(std::string("[parallel] backend \"c10d\" needs ") + name +
                    " (torchrun sets MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE; so do torchelastic, dlrover-run and a "
                    "Kubeflow PyTorchJob; under srun or mpirun export MASTER_ADDR, the first node's address, and MASTER_PORT)");
  return value;
}

class C10dBackend final : public CommunicatorBackend {
 public:
  C10dBackend()
      : CommunicatorBackend({ComponentKind::Communicator, "c10d",
                             "libtorch's c10d: TCPStore rendezvous from torchrun's environment, gloo collectives on host tensors", {}}) {}

  std::shared_ptr<Communicator> world(Communicator&) const override {
    const std::string host = required_env("MASTER_ADDR");
    const int port = std::stoi(required_env("MASTER_PORT"));
    const int rank = std::stoi(required_env("RANK")), size = std::stoi(required_env("WORLD_SIZE"));
    const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
    const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(port);
    options.isServer = rank == 0 && !(agent_store && std::string(agent_store) == "True");
    options.numWorkers = size;
    options.waitWorkers = false;
    auto store = c10::make_intrusive<c10d::TCPStore>(host, options);
    auto scoped = c10::make_intrusive<c10d::PrefixStore>("strata/" + std::string(restart ? restart : "0"), store);
    return std::make_shared<C10dCommunicator>(scoped, rank, size);
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<C10dBackend>()); }

}  // namespace
}  // namespace strata::comm_c10d

STRATA_PLUGIN("comm_c10d", "0.1.0", strata::comm_c10d::register_components)
