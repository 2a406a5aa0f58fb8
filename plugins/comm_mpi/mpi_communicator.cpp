#include "mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
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

// MPI counts are int. Messages and reductions larger than this go in pieces (reductions) or as one
// element of a derived datatype (byte moves). STRATA_MPI_MAX_COUNT lowers it, read once: a test
// hook, so that CI exercises these paths with small tensors.
int64_t max_count() {
  static const int64_t limit = [] {
    const char* text = std::getenv("STRATA_MPI_MAX_COUNT");
    const int64_t value = text ? std::atoll(text) : 0;
    return value > 0 ? std::min<int64_t>(value, std::numeric_limits<int>::max()) : std::numeric_limits<int>::max();
  }();
  return limit;
}

// `bytes` bytes as (count, datatype): MPI_BYTE when the count fits, else one element of a type
// made of max_count()-byte blocks plus the rest, with exactly `bytes` as its extent (so that
// consecutive elements, e.g. ranks' pieces in an all-gather, are laid out back to back).
class ByteCount {
 public:
  explicit ByteCount(int64_t bytes) {
    const int64_t limit = max_count();
    if (bytes <= limit) {
      count_ = static_cast<int>(bytes);
      return;
    }
    const int64_t blocks = bytes / limit, rest = bytes % limit;
    if (blocks > std::numeric_limits<int>::max())
      throw std::invalid_argument("message of " + std::to_string(bytes) + " bytes is too large for MPI");
    MPI_Datatype block = MPI_DATATYPE_NULL, body = MPI_DATATYPE_NULL, whole = MPI_DATATYPE_NULL;
    MPI_Type_contiguous(static_cast<int>(limit), MPI_BYTE, &block);
    MPI_Type_contiguous(static_cast<int>(blocks), block, &body);
    if (rest == 0) {
      whole = body;
    } else {
      int lengths[2] = {1, static_cast<int>(rest)};
      MPI_Aint displacements[2] = {0, static_cast<MPI_Aint>(blocks * limit)};
      MPI_Datatype types[2] = {body, MPI_BYTE};
      MPI_Type_create_struct(2, lengths, displacements, types, &whole);
    }
    MPI_Type_create_resized(whole, 0, static_cast<MPI_Aint>(bytes), &type_);
    MPI_Type_commit(&type_);
    if (whole != body) MPI_Type_free(&whole);
    MPI_Type_free(&body);
    MPI_Type_free(&block);
    owned_ = true;
    count_ = 1;
  }
  ~ByteCount() {
    if (owned_) MPI_Type_free(&type_);
  }
  ByteCount(const ByteCount&) = delete;
  ByteCount& operator=(const ByteCount&) = delete;
  int count() const { return count_; }
  MPI_Datatype type() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_BYTE;
  int count_ = 0;
  bool owned_ = false;
};

// In-place all-reduce of `n` elements at `data`, in pieces of at most max_count() elements.
void all_reduce_in_pieces(void* data, int64_t n, at::ScalarType dtype, ReduceOp op, MPI_Comm comm) {
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  for (int64_t done = 0; done < n;) {
    const int64_t piece = std::min(n - done, max_count());
    check(MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(data) + done * element, static_cast<int>(piece), mpi_type(dtype),
                        mpi_op(op, dtype), comm),
          "MPI_Allreduce");
    done += piece;
  }
}

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
    all_reduce_in_pieces(w.data_ptr(), w.numel(), w.scalar_type(), op, comm_);
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
    const int64_t chunk = out->work.numel();
    if (chunk <= max_count()) {
      check(MPI_Reduce_scatter_block(in->work.data_ptr(), out->work.data_ptr(), static_cast<int>(chunk),
                                     mpi_type(in->work.scalar_type()), mpi_op(op, in->work.scalar_type()), comm_),
            "MPI_Reduce_scatter_block");
    } else {
      // Chunks over the int limit: reduce everything in pieces and keep this rank's chunk (twice
      // the traffic of a reduce-scatter, only for chunks above 2^31 elements).
      at::Tensor all = in->work.clone();
      all_reduce_in_pieces(all.data_ptr(), all.numel(), all.scalar_type(), op, comm_);
      out->work.copy_(all.view(-1).narrow(0, rank_ * chunk, chunk).view_as(out->work));
    }
    if (op == ReduceOp::Avg) out->work.div_(n);
    out->finish();
  });
}

WorkPtr MpiCommunicator::all_gather(at::Tensor output, at::Tensor input) {
  if (output.numel() != input.numel() * size_) throw std::invalid_argument("all_gather: output must hold size() x input elements");
  auto in = std::make_shared<Buffer>(input, false);
  auto out = std::make_shared<Buffer>(output, false);
  return enqueue([this, in, out] {
    const ByteCount piece(static_cast<int64_t>(in->work.nbytes()));
    check(MPI_Allgather(in->work.data_ptr(), piece.count(), piece.type(), out->work.data_ptr(), piece.count(), piece.type(), comm_),
          "MPI_Allgather");
    out->finish();
  });
}

WorkPtr MpiCommunicator::broadcast(at::Tensor tensor, int root) {
  auto buffer = std::make_shared<Buffer>(tensor, false);
  return enqueue([this, buffer, root] {
    const ByteCount all(static_cast<int64_t>(buffer->work.nbytes()));
    check(MPI_Bcast(buffer->work.data_ptr(), all.count(), all.type(), root, comm_), "MPI_Bcast");
    buffer->finish();
  });
}

WorkPtr MpiCommunicator::all_to_all(at::Tensor output, at::Tensor input, std::vector<int64_t> output_splits,
                                    std::vector<int64_t> input_splits) {
  auto in = std::make_shared<Buffer>(input, false);
  auto out = std::make_shared<Buffer>(output, false);
  const int n = size_;
  const int64_t element = static_cast<int64_t>(input.element_size());
  // Byte counts and displacements per rank, 64-bit.
  auto counts = [&](const std::vector<int64_t>& splits, int64_t total) {
    std::vector<int64_t> c(static_cast<size_t>(n)), d(static_cast<size_t>(n));
    int64_t offset = 0;
    for (int r = 0; r < n; ++r) {
      const int64_t elems = splits.empty() ? total / n : splits[static_cast<size_t>(r)];
      c[static_cast<size_t>(r)] = elems * element;
      d[static_cast<size_t>(r)] = offset * element;
      offset += elems;
    }
    if (offset != total) throw std::invalid_argument("all_to_all: splits do not add up to the tensor's size");
    return std::pair(c, d);
  };
  auto [send_counts, send_displs] = counts(input_splits, input.numel());
  auto [recv_counts, recv_displs] = counts(output_splits, output.numel());
  const int64_t largest = std::max({*std::max_element(send_counts.begin(), send_counts.end()), send_displs.back(),
                                    *std::max_element(recv_counts.begin(), recv_counts.end()), recv_displs.back()});
  return enqueue([this, in, out, n, send_counts, send_displs, recv_counts, recv_displs, largest] {
    char* send = static_cast<char*>(in->work.data_ptr());
    char* recv = static_cast<char*>(out->work.data_ptr());
    if (largest <= max_count()) {
      auto as_int = [](const std::vector<int64_t>& v) { return std::vector<int>(v.begin(), v.end()); };
      const std::vector<int> sc = as_int(send_counts), sd = as_int(send_displs), rc = as_int(recv_counts), rd = as_int(recv_displs);
      check(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, comm_), "MPI_Alltoallv");
    } else {
      // Counts or offsets past the int limit: one message per peer, each of any size, on a tag
      // user messages may not use (comm.h: tags below 32767).
      constexpr int kTag = 32767;
      std::vector<MPI_Request> requests;
      for (int r = 0; r < n; ++r) {
        const size_t i = static_cast<size_t>(r);
        const ByteCount to(send_counts[i]), from(recv_counts[i]);
        requests.emplace_back();
        check(MPI_Irecv(recv + recv_displs[i], from.count(), from.type(), r, kTag, comm_, &requests.back()), "MPI_Irecv");
        requests.emplace_back();
        check(MPI_Isend(send + send_displs[i], to.count(), to.type(), r, kTag, comm_, &requests.back()), "MPI_Isend");
      }
      check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    }
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
  for (const auto& op : ops) buffers.push_back(std::make_shared<Buffer>(op.tensor, false));
  auto done = std::make_shared<std::promise<void>>();
  std::shared_future<void> future = done->get_future().share();
  std::vector<P2POp::Kind> kinds;
  std::vector<int> peers, tags;
  for (const auto& op : ops) kinds.push_back(op.kind), peers.push_back(op.peer), tags.push_back(op.tag);
  thread_->submit([this, buffers, kinds, peers, tags, done] {
    std::vector<MPI_Request> requests(buffers.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < buffers.size(); ++i) {
      at::Tensor& w = buffers[i]->work;
      // A derived type may be freed once the operation is posted (MPI keeps what it needs).
      const ByteCount bytes(static_cast<int64_t>(w.nbytes()));
      const int code = kinds[i] == P2POp::Kind::Send
                           ? MPI_Isend(w.data_ptr(), bytes.count(), bytes.type(), peers[i], tags[i], comm_, &requests[i])
                           : MPI_Irecv(w.data_ptr(), bytes.count(), bytes.type(), peers[i], tags[i], comm_, &requests[i]);
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
