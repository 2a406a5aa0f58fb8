#include "mpi_communicator.h"

#include <chrono>
#include <exception>
#include <limits>

#include <ATen/ATen.h>

#include "strata/errors.h"

namespace strata::comm_mpi {

namespace {

void check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(std::string(what) + " failed: " + std::string(text, static_cast<size_t>(length)));
}

// Reduced types: half precision goes through an fp32 buffer so sums accumulate in fp32.
bool reduced_in_fp32(const at::Tensor& t) { return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16; }

MPI_Datatype mpi_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kLong: return MPI_INT64_T;
    case at::kInt: return MPI_INT32_T;
    case at::kShort: return MPI_INT16_T;
    case at::kChar: return MPI_INT8_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kBool: return MPI_C_BOOL;
    default: throw UserError(std::string("the mpi communicator cannot reduce dtype ") + c10::toString(type));
  }
}

MPI_Op mpi_op(ReduceOp op, at::ScalarType type) {
  if (type == at::kBool) return op == ReduceOp::Max || op == ReduceOp::Sum ? MPI_LOR : MPI_LAND;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

void require_host(const at::Tensor& t) {
  if (!t.device().is_cpu())
    throw UserError("the mpi communicator moves host tensors only; use the nccl backend for " + t.device().str() + " tensors");
}

// A contiguous view or copy of `t` to hand to MPI, and how to put results back.
struct Buffer {
  at::Tensor original, work;
  explicit Buffer(const at::Tensor& t, bool fp32) : original(t) {
    require_host(t);
    work = fp32 ? t.to(at::kFloat).contiguous() : t.contiguous();
  }
  void finish() {
    if (!work.is_same(original)) original.copy_(work);
  }
};

class MpiWork final : public Work {
 public:
  explicit MpiWork(std::shared_future<void> done) : done_(std::move(done)) {}
  void wait() override { done_.get(); }

 private:
  std::shared_future<void> done_;
};

}  // namespace

MpiThread::MpiThread() : thread_([this] { loop(); }) {
  run([] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    }
    // Errors come back as codes that check() turns into exceptions, not as aborts.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  });
}

MpiThread::~MpiThread() {
  // While an exception unwinds, other ranks may be blocked in a collective with us: finalizing
  // would hang. The process is about to exit with an error and mpirun takes the job down.
  const bool failing = std::uncaught_exceptions() > 0;
  if (!failing) submit([] { MPI_Finalize(); }).wait();
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_one();
  if (failing)
    thread_.detach();
  else
    thread_.join();
}

std::shared_future<void> MpiThread::submit(std::function<void()> task) {
  std::packaged_task<void()> packaged(std::move(task));
  std::shared_future<void> done = packaged.get_future().share();
  {
    std::lock_guard lock(mutex_);
    tasks_.push_back(std::move(packaged));
  }
  ready_.notify_one();
  return done;
}

void MpiThread::loop() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock lock(mutex_);
      const auto has_work = [&] { return stopping_ || !tasks_.empty(); };
      // With messages in flight, wake up often to complete them; otherwise sleep until a task.
      if (pending_.empty())
        ready_.wait(lock, has_work);
      else
        ready_.wait_for(lock, std::chrono::microseconds(50), has_work);
      if (!tasks_.empty()) {
        task = std::move(tasks_.front());
        tasks_.pop_front();
      } else if (stopping_) {
        return;
      }
    }
    if (task.valid()) task();
    poll();
  }
}

void MpiThread::track(std::vector<MPI_Request> requests, std::function<void(const std::string&)> finished) {
  pending_.push_back({std::move(requests), std::move(finished)});
  poll();
}

void MpiThread::poll() {
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    int complete = 0;
    const int code = MPI_Testall(static_cast<int>(p.requests.size()), p.requests.data(), &complete, MPI_STATUSES_IGNORE);
    if (code == MPI_SUCCESS && !complete) {
      ++i;
      continue;
    }
    std::string error;
    if (code != MPI_SUCCESS) {
      char text[MPI_MAX_ERROR_STRING];
      int length = 0;
      MPI_Error_string(code, text, &length);
      error = "point-to-point message failed: " + std::string(text, static_cast<size_t>(length));
    }
    Pending done = std::move(p);
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    done.finished(error);
  }
}

MpiCommunicator::MpiCommunicator(std::shared_ptr<MpiThread> thread, MPI_Comm comm, bool owns)
    : thread_(std::move(thread)), comm_(comm), owns_(owns) {
  thread_->run([&] {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  });
}

MpiCommunicator::~MpiCommunicator() {
  if (owns_ && std::uncaught_exceptions() == 0) {
    MPI_Comm comm = comm_;
    thread_->run([comm]() mutable { MPI_Comm_free(&comm); });
  }
}

WorkPtr MpiCommunicator::enqueue(std::function<void()> task) {
  return std::make_shared<MpiWork>(thread_->submit(std::move(task)));
}

WorkPtr MpiCommunicator::all_reduce(at::Tensor tensor, ReduceOp op) {
  if (op == ReduceOp::Avg && !at::isFloatingType(tensor.scalar_type()))
    throw std::invalid_argument("all_reduce: Avg needs a floating-point tensor");
  auto buffer = std::make_shared<Buffer>(tensor, reduced_in_fp32(tensor));
  const int n = size_;
  return enqueue([this, buffer, op, n] {
    at::Tensor& w = buffer->work;
    check(MPI_Allreduce(MPI_IN_PLACE, w.data_ptr(), static_cast<int>(w.numel()), mpi_type(w.scalar_type()),
                        mpi_op(op, w.scalar_type()), comm_),
          "MPI_Allreduce");
    if (op == ReduceOp::Avg) w.div_(n);
    buffer->finish();
  });
}

WorkPtr MpiCommunicator::reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op) {
  if (input.numel() != output.numel() * size_)
    throw std::invalid_argument("reduce_scatter: input must hold size() x output elements");
  if (op == ReduceOp::Avg && !at::isFloatingType(input.scalar_type()))
    throw std::invalid_argument("reduce_scatter: Avg needs a floating-point tensor");
  auto in = std::make_shared<Buffer>(input, reduced_in_fp32(input));
  auto out = std::make_shared<Buffer>(output, reduced_in_fp32(output));
  const int n = size_;
  return enqueue([this, in, out, op, n] {
    check(MPI_Reduce_scatter_block(in->work.data_ptr(), out->work.data_ptr(), static_cast<int>(out->work.numel()),
                                   mpi_type(in->work.scalar_type()), mpi_op(op, in->work.scalar_type()), comm_),
          "MPI_Reduce_scatter_block");
    if (op == ReduceOp::Avg) out->work.div_(n);
    out->finish();
  });
}

WorkPtr MpiCommunicator::all_gather(at::Tensor output, at::Tensor input) {
  if (output.numel() != input.numel() * size_) throw std::invalid_argument("all_gather: output must hold size() x input elements");
  auto in = std::make_shared<Buffer>(input, false);
  auto out = std::make_shared<Buffer>(output, false);
  return enqueue([this, in, out] {
    const int bytes = static_cast<int>(in->work.nbytes());
    check(MPI_Allgather(in->work.data_ptr(), bytes, MPI_BYTE, out->work.data_ptr(), bytes, MPI_BYTE, comm_), "MPI_Allgather");
    out->finish();
  });
}

WorkPtr MpiCommunicator::broadcast(at::Tensor tensor, int root) {
  auto buffer = std::make_shared<Buffer>(tensor, false);
  return enqueue([this, buffer, root] {
    check(MPI_Bcast(buffer->work.data_ptr(), static_cast<int>(buffer->work.nbytes()), MPI_BYTE, root, comm_), "MPI_Bcast");
    buffer->finish();
  });
}

WorkPtr MpiCommunicator::all_to_all(at::Tensor output, at::Tensor input, std::vector<int64_t> output_splits,
                                    std::vector<int64_t> input_splits) {
  auto in = std::make_shared<Buffer>(input, false);
  auto out = std::make_shared<Buffer>(output, false);
  const int n = size_;
  const int64_t element = static_cast<int64_t>(input.element_size());
  auto counts = [&](const std::vector<int64_t>& splits, int64_t total) {
    std::vector<int> c(static_cast<size_t>(n)), d(static_cast<size_t>(n));
    int64_t offset = 0;
    for (int r = 0; r < n; ++r) {
      int64_t elems = splits.empty() ? total / n : splits[static_cast<size_t>(r)];
      c[static_cast<size_t>(r)] = static_cast<int>(elems * element);
      d[static_cast<size_t>(r)] = static_cast<int>(offset * element);
      offset += elems;
    }
    if (offset != total) throw std::invalid_argument("all_to_all: splits do not add up to the tensor's size");
    return std::pair(c, d);
  };
  auto [send_counts, send_displs] = counts(input_splits, input.numel());
  auto [recv_counts, recv_displs] = counts(output_splits, output.numel());
  return enqueue([this, in, out, send_counts, send_displs, recv_counts, recv_displs] {
    check(MPI_Alltoallv(in->work.data_ptr(), send_counts.data(), send_displs.data(), MPI_BYTE, out->work.data_ptr(),
                        recv_counts.data(), recv_displs.data(), MPI_BYTE, comm_),
          "MPI_Alltoallv");
    out->finish();
  });
}

WorkPtr MpiCommunicator::send(at::Tensor tensor, int peer, int tag) {
  return batch_p2p({P2POp{P2POp::Kind::Send, std::move(tensor), peer, tag}});
}

WorkPtr MpiCommunicator::recv(at::Tensor tensor, int peer, int tag) {
  return batch_p2p({P2POp{P2POp::Kind::Recv, std::move(tensor), peer, tag}});
}

// Posts MPI_Isend/MPI_Irecv for every message on the MPI thread and returns at once; the thread
// completes them between later tasks (MpiThread::poll), then the Work's wait() returns.
WorkPtr MpiCommunicator::batch_p2p(std::vector<P2POp> ops) {
  std::vector<std::shared_ptr<Buffer>> buffers;
  for (const auto& op : ops) {
    if (op.tensor.nbytes() > static_cast<size_t>(std::numeric_limits<int>::max()))
      throw std::invalid_argument("the mpi communicator sends at most 2 GiB per message; split the tensor");
    buffers.push_back(std::make_shared<Buffer>(op.tensor, false));
  }
  auto done = std::make_shared<std::promise<void>>();
  std::shared_future<void> future = done->get_future().share();
  std::vector<P2POp::Kind> kinds;
  std::vector<int> peers, tags;
  for (const auto& op : ops) kinds.push_back(op.kind), peers.push_back(op.peer), tags.push_back(op.tag);
  thread_->submit([this, buffers, kinds, peers, tags, done] {
    std::vector<MPI_Request> requests(buffers.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < buffers.size(); ++i) {
      at::Tensor& w = buffers[i]->work;
      const int bytes = static_cast<int>(w.nbytes());
      const int code = kinds[i] == P2POp::Kind::Send ? MPI_Isend(w.data_ptr(), bytes, MPI_BYTE, peers[i], tags[i], comm_, &requests[i])
                                                     : MPI_Irecv(w.data_ptr(), bytes, MPI_BYTE, peers[i], tags[i], comm_, &requests[i]);
      if (code != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int length = 0;
        MPI_Error_string(code, text, &length);
        done->set_exception(std::make_exception_ptr(std::runtime_error("MPI_Isend/MPI_Irecv failed: " + std::string(text, static_cast<size_t>(length)))));
        return;
      }
    }
    thread_->track(std::move(requests), [buffers, kinds, done](const std::string& error) {
      if (!error.empty()) return done->set_exception(std::make_exception_ptr(std::runtime_error(error)));
      for (size_t i = 0; i < buffers.size(); ++i)
        if (kinds[i] == P2POp::Kind::Recv) buffers[i]->finish();
      done->set_value();
    });
  });
  return std::make_shared<MpiWork>(future);
}

WorkPtr MpiCommunicator::barrier() {
  return enqueue([this] { check(MPI_Barrier(comm_), "MPI_Barrier"); });
}

std::shared_ptr<Communicator> MpiCommunicator::split(const std::vector<int>& ranks) {
  MPI_Comm group = MPI_COMM_NULL;
  int position = 0;
  while (position < static_cast<int>(ranks.size()) && ranks[static_cast<size_t>(position)] != rank_) ++position;
  if (position == static_cast<int>(ranks.size())) throw std::invalid_argument("split: this rank is not in its own group");
  thread_->run([&] { check(MPI_Comm_split(comm_, ranks.front(), position, &group), "MPI_Comm_split"); });
  return std::make_shared<MpiCommunicator>(thread_, group, true);
}

std::shared_ptr<Communicator> mpi_world() {
  static std::weak_ptr<Communicator> world;
  if (auto existing = world.lock()) return existing;
  auto created = std::make_shared<MpiCommunicator>(std::make_shared<MpiThread>(), MPI_COMM_WORLD, false);
  world = created;
  return created;
}

}  // namespace strata::comm_mpi
