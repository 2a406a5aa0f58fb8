#include "strata/core/local_communicator.h"

#include <ATen/ATen.h>

#include "strata/errors.h"

namespace strata {

namespace {

class Done final : public Work {
 public:
  void wait() override {}
};

class LocalCommunicator final : public Communicator, public std::enable_shared_from_this<LocalCommunicator> {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  WorkPtr all_reduce(at::Tensor, ReduceOp) override { return done(); }
  WorkPtr reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp) override { return copy(output, input); }
  WorkPtr all_gather(at::Tensor output, at::Tensor input) override { return copy(output, input); }
  WorkPtr broadcast(at::Tensor, int) override { return done(); }
  WorkPtr all_to_all(at::Tensor output, at::Tensor input, std::vector<int64_t>, std::vector<int64_t>) override {
    return copy(output, input);
  }
  WorkPtr send(at::Tensor, int peer, int) override { throw std::invalid_argument("send to rank " + std::to_string(peer) + " of a one-rank world"); }
  WorkPtr recv(at::Tensor, int peer, int) override { throw std::invalid_argument("recv from rank " + std::to_string(peer) + " of a one-rank world"); }
  WorkPtr barrier() override { return done(); }
  std::shared_ptr<Communicator> split(const std::vector<int>&) override { return shared_from_this(); }

 private:
  static WorkPtr done() { return std::make_shared<Done>(); }
  static WorkPtr copy(at::Tensor& output, const at::Tensor& input) {
    output.view(-1).copy_(input.reshape(-1));
    return done();
  }
};

}  // namespace

std::shared_ptr<Communicator> local_communicator() { return std::make_shared<LocalCommunicator>(); }

}  // namespace strata
