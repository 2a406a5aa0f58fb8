// The differentiable collectives of strata/dist.h: one autograd Function per pair. The group is
// kept in the node as a pointer (the job's topology owns it for the whole run).
#include "strata/dist.h"

#include <atomic>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace strata::dist {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t wrap_dim(int64_t dim, const at::Tensor& x) {
  const int64_t rank = x.dim();
  if (dim < -rank || dim >= rank)
    throw std::invalid_argument("dimension " + std::to_string(dim) + " is out of range for a tensor with " + std::to_string(rank) +
                                " dimensions");
  return dim < 0 ? dim + rank : dim;
}

// Collectives run on the training thread and autograd's (one at a time per process here, but
// atomics cost nothing next to a collective).
std::atomic<int64_t> all_reduce_bytes{0}, all_gather_bytes{0}, reduce_scatter_bytes{0}, all_to_all_bytes{0};

int64_t bytes(const at::Tensor& x) { return static_cast<int64_t>(x.numel() * x.element_size()); }

void all_reduce_counted(at::Tensor& x, ReduceOp op, Communicator& group) {
  all_reduce_bytes += bytes(x);
  group.all_reduce(x, op)->wait();
}

Communicator& group_of(AutogradContext* ctx) { return *reinterpret_cast<Communicator*>(ctx->saved_data["group"].toInt()); }

// The collectives themselves, without autograd. The communicator works on dim-0 chunks of
// contiguous tensors, so `dim` moves to the front and back.
at::Tensor all_reduce_sum(const at::Tensor& x, Communicator& group) {
  at::Tensor out = x.contiguous().clone();
  all_reduce_counted(out, ReduceOp::Sum, group);
  return out;
}

at::Tensor all_gather_dim(const at::Tensor& x, int64_t dim, Communicator& group) {
  const at::Tensor front = x.movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] *= group.size();
  at::Tensor out = at::empty(shape, front.options());
  all_gather_bytes += bytes(out);
  group.all_gather(out, front)->wait();
  return out.movedim(0, dim).contiguous();
}

at::Tensor reduce_scatter_dim(const at::Tensor& x, int64_t dim, Communicator& group) {
  if (x.size(dim) % group.size() != 0)
    throw std::invalid_argument("reduce_scatter_along: dimension " + std::to_string(dim) + " has size " + std::to_string(x.size(dim)) +
                                ", not a multiple of the group size " + std::to_string(group.size()));
  const at::Tensor front = x.movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] /= group.size();
  at::Tensor out = at::empty(shape, front.options());
  reduce_scatter_bytes += bytes(front);
  group.reduce_scatter(out, front, ReduceOp::Sum)->wait();
  return out.movedim(0, dim).contiguous();
}

at::Tensor chunk_dim(const at::Tensor& x, int64_t dim, Communicator& group) {
  if (x.size(dim) % group.size() != 0)
    throw std::invalid_argument("scatter_along: dimension " + std::to_string(dim) + " has size " + std::to_string(x.size(dim)) +
                                ", not a multiple of the group size " + std::to_string(group.size()));
  const int64_t chunk = x.size(dim) / group.size();
  return x.narrow(dim, group.rank() * chunk, chunk).contiguous();
}

at::Tensor exchange(const at::Tensor& x, int64_t scatter_dim, int64_t gather_dim, Communicator& group) {
  const int64_t n = group.size();
  if (x.size(scatter_dim) % n != 0)
    throw std::invalid_argument("all_to_all: dimension " + std::to_string(scatter_dim) + " has size " +
                                std::to_string(x.size(scatter_dim)) + ", not a multiple of the group size " + std::to_string(n));
  // Chunk j (for rank j) as row j of one contiguous buffer; row j of the result came from rank j.
  const at::Tensor send = at::stack(x.chunk(n, scatter_dim), 0).contiguous();
  at::Tensor received = at::empty_like(send);
  all_to_all_bytes += bytes(send);
  group.all_to_all(received, send, {}, {})->wait();
  return at::cat(received.unbind(0), gather_dim);
}

struct CopyToGroup : torch::autograd::Function<CopyToGroup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduce_sum(grads[0], group_of(ctx)), at::Tensor()};
  }
};

struct ReduceFromGroup : torch::autograd::Function<ReduceFromGroup> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, int64_t group) {
    return all_reduce_sum(x, *reinterpret_cast<Communicator*>(group));
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets, int64_t vocab_start,
                            int64_t group) {
    Communicator& g = *reinterpret_cast<Communicator*>(group);
    const at::Tensor z = logits.to(at::kFloat);
    const int64_t columns = z.size(1);
    at::Tensor max = std::get<0>(z.max(1)).contiguous();
    all_reduce_counted(max, ReduceOp::Max, g);
    at::Tensor exp = (z - max.unsqueeze(1)).exp_();
    at::Tensor sum = exp.sum(1).contiguous();
    all_reduce_counted(sum, ReduceOp::Sum, g);
    const at::Tensor local = targets - vocab_start;
    const at::Tensor mine = local.ge(0).logical_and_(local.lt(columns));
    const at::Tensor column = local.clamp(0, columns - 1).unsqueeze(1);
    at::Tensor target_logit = z.gather(1, column).squeeze(1).masked_fill(mine.logical_not(), 0.0).contiguous();
    all_reduce_counted(target_logit, ReduceOp::Sum, g);
    // log(sum exp(z - max)) + max - z_target, per token
    const at::Tensor loss = sum.log() + max - target_logit;
    ctx->save_for_backward({exp, sum, column, mine});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss.mean();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &exp = saved[0], &sum = saved[1], &column = saved[2], &mine = saved[3];
    at::Tensor grad = exp / sum.unsqueeze(1);
    grad.scatter_add_(1, column, mine.to(grad.scalar_type()).neg().unsqueeze(1));
    grad.mul_(grads[0] / static_cast<double>(exp.size(0)));
    return {grad.to(static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt())), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct GatherAlong : torch::autograd::Function<GatherAlong> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim, int64_t group) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    return all_gather_dim(x, dim, group_of(ctx));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {reduce_scatter_dim(grads[0], ctx->saved_data["dim"].toInt(), group_of(ctx)), at::Tensor(), at::Tensor()};
  }
};

struct ReduceScatterAlong : torch::autograd::Function<ReduceScatterAlong> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim, int64_t group) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    return reduce_scatter_dim(x, dim, group_of(ctx));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gather_dim(grads[0], ctx->saved_data["dim"].toInt(), group_of(ctx)), at::Tensor(), at::Tensor()};
  }
};

struct ScatterAlong : torch::autograd::Function<ScatterAlong> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim, int64_t group) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    return chunk_dim(x, dim, group_of(ctx));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gather_dim(grads[0], ctx->saved_data["dim"].toInt(), group_of(ctx)), at::Tensor(), at::Tensor()};
  }
};

struct AllToAll : torch::autograd::Function<AllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t scatter_dim, int64_t gather_dim, int64_t group) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["scatter"] = scatter_dim;
    ctx->saved_data["gather"] = gather_dim;
    return exchange(x, scatter_dim, gather_dim, group_of(ctx));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // The inverse exchange: what was gathered along gather_dim goes back, scattered along it.
    return {exchange(grads[0], ctx->saved_data["gather"].toInt(), ctx->saved_data["scatter"].toInt(), group_of(ctx)), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

int64_t handle(Communicator& group) { return reinterpret_cast<int64_t>(&group); }

}  // namespace

Traffic traffic() { return {all_reduce_bytes.load(), all_gather_bytes.load(), reduce_scatter_bytes.load(), all_to_all_bytes.load()}; }

at::Tensor copy_to_group(const at::Tensor& x, Communicator& group) {
  return group.size() == 1 ? x : CopyToGroup::apply(x, handle(group));
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t vocab_start,
                                        Communicator& group) {
  if (logits.dim() != 2 || targets.dim() != 1 || logits.size(0) != targets.size(0))
    throw std::invalid_argument("vocab_parallel_cross_entropy: logits [N, V/t] and targets [N] expected");
  return VocabParallelCrossEntropy::apply(logits, targets, vocab_start, handle(group));
}

at::Tensor reduce_from_group(const at::Tensor& x, Communicator& group) {
  return group.size() == 1 ? x : ReduceFromGroup::apply(x, handle(group));
}

at::Tensor gather_along(const at::Tensor& x, int64_t dim, Communicator& group) {
  return group.size() == 1 ? x : GatherAlong::apply(x, wrap_dim(dim, x), handle(group));
}

at::Tensor reduce_scatter_along(const at::Tensor& x, int64_t dim, Communicator& group) {
  return group.size() == 1 ? x : ReduceScatterAlong::apply(x, wrap_dim(dim, x), handle(group));
}

at::Tensor scatter_along(const at::Tensor& x, int64_t dim, Communicator& group) {
  return group.size() == 1 ? x : ScatterAlong::apply(x, wrap_dim(dim, x), handle(group));
}

at::Tensor all_to_all(const at::Tensor& x, int64_t scatter_dim, int64_t gather_dim, Communicator& group) {
  return group.size() == 1 ? x : AllToAll::apply(x, wrap_dim(scatter_dim, x), wrap_dim(gather_dim, x), handle(group));
}

}  // namespace strata::dist
