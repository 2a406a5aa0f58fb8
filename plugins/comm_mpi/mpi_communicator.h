// Communicator over OpenMPI for host tensors. Every MPI call of the process runs on one
// dedicated thread, in the order operations were issued, so communication overlaps the
// caller's computation and MPI needs only MPI_THREAD_FUNNELED. Point-to-point messages are
// posted non-blocking and completed by that thread between tasks, so a blocking receive never
// holds the thread while the matching send waits behind it.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include <mpi.h>

#include "strata/comm.h"

namespace strata::comm_mpi {

class MpiThread {
 public:
  MpiThread();
  ~MpiThread();
  // Runs `task` on the MPI thread after every task queued before it.
  std::shared_future<void> submit(std::function<void()> task);
  // Runs `task` and waits for it.
  void run(std::function<void()> task) { submit(std::move(task)).get(); }
  // Called on the MPI thread by a task that posted `requests`: `finished` runs there once all
  // completed (or with the error text when one failed), polled between tasks.
  void track(std::vector<MPI_Request> requests, std::function<void(const std::string& error)> finished);

 private:
  void loop();
  void poll();
  struct Pending {
    std::vector<MPI_Request> requests;
    std::function<void(const std::string&)> finished;
  };
  std::vector<Pending> pending_;  // touched on the MPI thread only
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(std::shared_ptr<MpiThread> thread, MPI_Comm comm, bool owns);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  WorkPtr all_reduce(at::Tensor tensor, ReduceOp op) override;
  WorkPtr reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op) override;
  WorkPtr all_gather(at::Tensor output, at::Tensor input) override;
  WorkPtr broadcast(at::Tensor tensor, int root) override;
  WorkPtr all_to_all(at::Tensor output, at::Tensor input, std::vector<int64_t> output_splits,
                     std::vector<int64_t> input_splits) override;
  WorkPtr send(at::Tensor tensor, int peer, int tag) override;
  WorkPtr recv(at::Tensor tensor, int peer, int tag) override;
  WorkPtr batch_p2p(std::vector<P2POp> ops) override;
  WorkPtr barrier() override;
  std::shared_ptr<Communicator> split(const std::vector<int>& ranks) override;

 private:
  WorkPtr enqueue(std::function<void()> task);
  std::shared_ptr<MpiThread> thread_;
  MPI_Comm comm_;
  bool owns_;
  int rank_ = 0, size_ = 1;
};

// The process's world communicator; MPI starts on first use and finalizes at exit.
std::shared_ptr<Communicator> mpi_world();

}  // namespace strata::comm_mpi
