#include "strata/core/local_communicator.h"

#include <algorithm>

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
  // Messages to itself: each send is matched with the next receive of the same tag.
  WorkPtr batch_p2p(std::vector<P2POp> ops) override {
    std::vector<const P2POp*> sends;
    for (const auto& op : ops)
      if (op.peer != 0) throw std::invalid_argument("message to rank " + std::to_string(op.peer) + " of a one-rank world");
    for (const auto& op : ops)
      if (op.kind == P2POp::Kind::Send) sends.push_back(&op);
    for (const auto& op : ops) {
      if (op.kind != P2POp::Kind::Recv) continue;
      auto it = std::find_if(sends.begin(), sends.end(), [&](const P2POp* s) { return s->tag == op.tag; });
      if (it == sends.end()) throw std::invalid_argument("receive with tag " + std::to_string(op.tag) + " has no matching send in the batch");
      op.tensor.copy_((*it)->tensor);
      sends.erase(it);
    }
    if (!sends.empty()) throw std::invalid_argument("send with tag " + std::to_string(sends.front()->tag) + " has no matching receive in the batch");
    return done();
  }
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
