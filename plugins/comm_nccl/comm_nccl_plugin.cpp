// The nccl communicator backend: CUDA tensors, one NCCL communicator per group, each with its
// own stream. An operation waits for the work already queued on the caller's current stream,
// runs on the communicator's stream, and its Work makes the caller's stream wait for it, so
// ordering holds without blocking the host. Tensors stay alive (and the caching allocator is
// told about the second stream) until the operation completes.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include "strata/plugin.h"

namespace strata::comm_nccl {
namespace {

void check(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) throw std::runtime_error(std::string(what) + " failed: " + ncclGetErrorString(result));
}

ncclDataType_t nccl_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kChar: return ncclInt8;
    case at::kByte:
    case at::kBool: return ncclUint8;
    default: throw UserError(std::string("the nccl communicator cannot move dtype ") + c10::toString(type));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

bool half_precision(const at::Tensor& t) { return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16; }

// Throws the communicator's asynchronous error (a peer that failed, a network error), if any.
void check_async(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return;  // cannot tell; the next call will
  if (state != ncclSuccess && state != ncclInProgress)
    throw std::runtime_error(std::string("NCCL communicator failed asynchronously: ") + ncclGetErrorString(state) + " (" +
                             ncclGetLastError(comm) + ")");
}

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<at::cuda::CUDAEvent> done, std::vector<at::Tensor> keep, ncclComm_t comm)
      : done_(std::move(done)), keep_(std::move(keep)), comm_(comm) {}
  // The caller's stream waits for the operation; the host does not. Errors NCCL has detected by
  // now surface here instead of as a hang later.
  void wait() override {
    check_async(comm_);
    done_->block(c10::cuda::getCurrentCUDAStream());
  }

 private:
  std::shared_ptr<at::cuda::CUDAEvent> done_;
  std::vector<at::Tensor> keep_;
  ncclComm_t comm_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device) : comm_(comm), device_(device), stream_(c10::cuda::getStreamFromPool(true, device)) {
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check(ncclCommCount(comm_, &size_), "ncclCommCount");
  }
  ~NcclCommunicator() override {
    if (std::uncaught_exceptions() == 0) ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  WorkPtr all_reduce(at::Tensor tensor, ReduceOp op) override {
    // Half precision goes through fp32 so sums accumulate in fp32.
    at::Tensor work = half_precision(tensor) ? tensor.to(at::kFloat) : tensor;
    return run({tensor, work}, [&] {
      check(ncclAllReduce(work.data_ptr(), work.data_ptr(), work.numel(), nccl_type(work.scalar_type()), nccl_op(op), comm_, stream_),
            "ncclAllReduce");
      if (!work.is_same(tensor)) tensor.copy_(work);
    });
  }

  WorkPtr reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op) override {
    at::Tensor in = half_precision(input) ? input.to(at::kFloat) : input;
    at::Tensor out = half_precision(output) ? at::empty(output.sizes(), output.options().dtype(at::kFloat)) : output;
    return run({input, output, in, out}, [&] {
      check(ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), nccl_type(in.scalar_type()), nccl_op(op), comm_, stream_),
            "ncclReduceScatter");
      if (!out.is_same(output)) output.copy_(out);
    });
  }

  WorkPtr all_gather(at::Tensor output, at::Tensor input) override {
    return run({output, input}, [&] {
      check(ncclAllGather(input.data_ptr(), output.data_ptr(), input.nbytes(), ncclUint8, comm_, stream_), "ncclAllGather");
    });
  }

  WorkPtr broadcast(at::Tensor tensor, int root) override {
    return run({tensor}, [&] {
      check(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.nbytes(), ncclUint8, root, comm_, stream_), "ncclBroadcast");
    });
  }

  WorkPtr all_to_all(at::Tensor output, at::Tensor input, std::vector<int64_t> output_splits,
                     std::vector<int64_t> input_splits) override {
    const int64_t element = static_cast<int64_t>(input.element_size());
    return run({output, input}, [&] {
      check(ncclGroupStart(), "ncclGroupStart");
      int64_t send_offset = 0, recv_offset = 0;
      for (int peer = 0; peer < size_; ++peer) {
        const int64_t send = input_splits.empty() ? input.numel() / size_ : input_splits[static_cast<size_t>(peer)];
        const int64_t recv = output_splits.empty() ? output.numel() / size_ : output_splits[static_cast<size_t>(peer)];
        check(ncclSend(static_cast<char*>(input.data_ptr()) + send_offset * element, send * element, ncclUint8, peer, comm_, stream_), "ncclSend");
        check(ncclRecv(static_cast<char*>(output.data_ptr()) + recv_offset * element, recv * element, ncclUint8, peer, comm_, stream_), "ncclRecv");
        send_offset += send;
        recv_offset += recv;
      }
      check(ncclGroupEnd(), "ncclGroupEnd");
    });
  }

  WorkPtr send(at::Tensor tensor, int peer, int) override {
    return run({tensor}, [&] { check(ncclSend(tensor.data_ptr(), tensor.nbytes(), ncclUint8, peer, comm_, stream_), "ncclSend"); });
  }

  WorkPtr recv(at::Tensor tensor, int peer, int) override {
    return run({tensor}, [&] { check(ncclRecv(tensor.data_ptr(), tensor.nbytes(), ncclUint8, peer, comm_, stream_), "ncclRecv"); });
  }

  // One NCCL group: both directions of an exchange proceed together instead of each blocking
  // until its peer posts the matching call.
  WorkPtr batch_p2p(std::vector<P2POp> ops) override {
    std::vector<at::Tensor> tensors;
    for (const auto& op : ops) tensors.push_back(op.tensor);
    return run(tensors, [&] {
      check(ncclGroupStart(), "ncclGroupStart");
      for (const auto& op : ops) {
        if (op.kind == P2POp::Kind::Send)
          check(ncclSend(op.tensor.data_ptr(), op.tensor.nbytes(), ncclUint8, op.peer, comm_, stream_), "ncclSend");
        else
          check(ncclRecv(op.tensor.data_ptr(), op.tensor.nbytes(), ncclUint8, op.peer, comm_, stream_), "ncclRecv");
      }
      check(ncclGroupEnd(), "ncclGroupEnd");
    });
  }

  WorkPtr barrier() override { return all_reduce(at::zeros({1}, at::TensorOptions().device(at::kCUDA, device_)), ReduceOp::Sum); }

  std::shared_ptr<Communicator> split(const std::vector<int>& ranks) override {
    int position = 0;
    while (ranks[static_cast<size_t>(position)] != rank_) ++position;
    ncclComm_t group = nullptr;
    check(ncclCommSplit(comm_, ranks.front(), position, &group, nullptr), "ncclCommSplit");
    return std::make_shared<NcclCommunicator>(group, device_);
  }

 private:
  // Runs `enqueue` (which issues NCCL and copy work) on this communicator's stream after the
  // caller's stream has reached this point.
  WorkPtr run(std::vector<at::Tensor> tensors, const std::function<void()>& enqueue) {
    for (const auto& t : tensors)
      if (!t.is_cuda()) throw UserError("the nccl communicator moves CUDA tensors only; use the mpi backend for host tensors");
    c10::cuda::CUDAGuard guard(device_);
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream());
    ready.block(stream_);
    {
      c10::cuda::CUDAStreamGuard on_comm_stream(stream_);
      enqueue();
    }
    for (const auto& t : tensors) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    done->record(stream_);
    return std::make_shared<NcclWork>(done, std::move(tensors), comm_);
  }

  ncclComm_t comm_;
  int device_;
  c10::cuda::CUDAStream stream_;
  int rank_ = 0, size_ = 1;
};

class NcclBackend final : public CommunicatorBackend {
 public:
  NcclBackend()
      : CommunicatorBackend({ComponentKind::Communicator, "nccl",
                             "NCCL collectives on CUDA tensors, one stream per group, bootstrapped over the mpi or c10d backend", {}}) {}

  std::shared_ptr<Communicator> world(Communicator& bootstrap) const override {
    if (!at::hasCUDA()) throw UserError("[parallel] backend = \"nccl\" but no CUDA device is available");
    // The job's device: core makes it current before starting communicators (one device per
    // local rank under any launcher, slots excluded by the health check skipped).
    const int device = c10::cuda::current_device();
    c10::cuda::CUDAGuard guard(device);
    ncclUniqueId id;
    if (bootstrap.rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    at::Tensor bytes = at::from_blob(&id, {static_cast<int64_t>(sizeof id)}, at::kByte).clone();
    bootstrap.broadcast(bytes, 0)->wait();
    std::memcpy(&id, bytes.data_ptr(), sizeof id);
    ncclComm_t comm = nullptr;
    check(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()), "ncclCommInitRank");
    return std::make_shared<NcclCommunicator>(comm, device);
  }
};

void register_components(Registry& registry) { registry.add(std::make_unique<NcclBackend>()); }

}  // namespace
}  // namespace strata::comm_nccl

STRATA_PLUGIN("comm_nccl", "0.1.0", strata::comm_nccl::register_components)
