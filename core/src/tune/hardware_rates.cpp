// This machine's rates as `ranks` ranks of a training job see them, measured on one thread:
//
// * matmul FLOP/s: a 256^3 fp32 matmul, the rate of a GEMM whose operands stay in cache;
// * the parameter pass: what a rank pays per parameter it computes with, per micro-batch, beyond
//   the FLOPs. A training step's weights and gradients do not stay in cache: each micro-batch
//   streams every weight through the forward GEMM and the backward's input-gradient GEMM and
//   accumulates every weight gradient. Measured on 16 linear layers of 1024 x 1024 (64 MiB of
//   weights, 64 MiB of gradients), forward and backward by the three GEMMs a linear layer runs,
//   at 16 and at 128 tokens: the time is linear in the tokens, and its intercept over the
//   parameters is the per-parameter cost (0.5-0.8 ns on this 2-core machine, where a layer of
//   d_model 256 at 16 tokens pays about as much for its parameters as for its FLOPs);
// * the per-layer overhead: a pre-norm transformer block at d_model 16 and 8 tokens, forward and
//   backward under autograd, where the arithmetic is nothing and the time is operator dispatch;
// * from `strata doctor -n ranks` (the same ranks, launched the same way): the all-reduce bus
//   bandwidth, the latency of a one-float all-reduce and the memory a rank holds before it
//   builds anything;
// * how many ranks share a core.
// Why these terms: bench/results/tune_cpu.md (issue 35) found the model without the parameter pass
// and with a 1e-4 s layer overhead underestimating every layout that splits tokens (context
// parallel) or heads (tensor parallel) rather than parameters or micro-batches.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "strata/core/statistics.h"
#include "strata/core/tune.h"
#include "strata/core/process_memory.h"
#include "strata/errors.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// Median seconds of `fn` over runs of `rounds` calls each, for about `budget_s` (at least 3 runs).
template <class Fn>
double median_seconds(Fn fn, int rounds, double budget_s) {
  fn();  // warm-up: allocations, the BLAS library's buffers
  std::vector<double> runs;
  const auto begin = std::chrono::steady_clock::now();
  while (runs.size() < 3 || seconds_since(begin) < budget_s) {
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < rounds; ++r) fn();
    runs.push_back(seconds_since(start) / rounds);
  }
  return median(std::move(runs));
}

double matmul_flops_per_s() {
  const int64_t n = 256;
  const at::Tensor a = at::randn({n, n}), b = at::randn({n, n});
  return 2.0 * n * n * n / median_seconds([&] { (void)at::matmul(a, b); }, 20, 0.2);
}

double parameter_pass_seconds() {
  constexpr int64_t kLayers = 16, kWidth = 1024, kFewTokens = 16, kManyTokens = 128;
  std::vector<at::Tensor> weights, grads;
  for (int64_t l = 0; l < kLayers; ++l) weights.push_back(at::randn({kWidth, kWidth})), grads.push_back(at::zeros({kWidth, kWidth}));
  auto sweep_seconds = [&](int64_t tokens) {
    const at::Tensor x = at::randn({tokens, kWidth}), g = at::randn({tokens, kWidth});
    return median_seconds(
        [&] {
          for (int64_t l = 0; l < kLayers; ++l) {
            (void)at::mm(x, weights[l].t());      // forward
            (void)at::mm(g, weights[l]);          // gradient of the input
            grads[l].addmm_(g.t(), x);            // gradient of the weight, accumulated
          }
        },
        1, 0.25);
  };
  const double few = sweep_seconds(kFewTokens), many = sweep_seconds(kManyTokens);
  const double per_token = (many - few) / static_cast<double>(kManyTokens - kFewTokens);
  const double intercept = few - per_token * static_cast<double>(kFewTokens);
  return std::max(0.0, intercept) / static_cast<double>(kLayers * kWidth * kWidth);
}

double layer_overhead_seconds() {
  constexpr int64_t kTokens = 8, kDim = 16, kHeads = 2;
  auto param = [](std::vector<int64_t> shape) { return (at::randn(shape) * 0.1).requires_grad_(true); };
  const at::Tensor ln_w = param({kDim}), ln_b = param({kDim}), qkv_w = param({3 * kDim, kDim}), qkv_b = param({3 * kDim}),
                   out_w = param({kDim, kDim}), out_b = param({kDim}), ln2_w = param({kDim}), ln2_b = param({kDim}),
                   fc_w = param({4 * kDim, kDim}), fc_b = param({4 * kDim}), proj_w = param({kDim, 4 * kDim}), proj_b = param({kDim});
  const at::Tensor input = at::randn({1, kTokens, kDim});
  auto block = [&] {
    const at::Tensor x = input.clone().requires_grad_(true);
    auto heads = [&](const at::Tensor& t) { return t.view({1, kTokens, kHeads, kDim / kHeads}).transpose(1, 2); };
    const auto qkv = at::linear(at::layer_norm(x, {kDim}, ln_w, ln_b), qkv_w, qkv_b).chunk(3, -1);
    const at::Tensor attention = at::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), {}, 0.0, true);
    const at::Tensor x2 = x + at::linear(attention.transpose(1, 2).reshape({1, kTokens, kDim}), out_w, out_b);
    const at::Tensor mlp = at::linear(at::gelu(at::linear(at::layer_norm(x2, {kDim}, ln2_w, ln2_b), fc_w, fc_b)), proj_w, proj_b);
    (x2 + mlp).sum().backward();
  };
  return median_seconds(block, 20, 0.2);
}

}  // namespace

HardwareRates measure_rates(int64_t ranks, const std::filesystem::path& strata_executable) {
  HardwareRates rates;
  at::set_num_threads(1);
  rates.flops_per_s = matmul_flops_per_s();
  rates.parameter_pass_s = parameter_pass_seconds();
  rates.layer_overhead_s = layer_overhead_seconds();
  // After the probes, as a training rank is: the BLAS library holds its buffers from the first call.
  rates.process_bytes = resident_bytes();
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  rates.oversubscription = std::max(1.0, static_cast<double>(ranks) / cores);
  if (ranks < 2) return rates;
  const std::string command = "'" + strata_executable.string() + "' doctor -n " + std::to_string(ranks) + " 2>&1";
  std::string output;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, pipe)) output += buf;
    pclose(pipe);
  }
  double gbs = 0, us = -1, start_mib = 0;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::sscanf(line.c_str(), "all ranks: all-reduce bus bandwidth %lf GB/s", &gbs);
    std::sscanf(line.c_str(), "all ranks: all-reduce latency %lf us", &us);
    std::sscanf(line.c_str(), "all ranks: resident memory at start %lf MiB", &start_mib);
  }
  // The doctor's latency is a difference of two timings (collectives between matmuls, minus the
  // matmuls alone) and reads 0.0 when the matmuls' own jitter hides it; take 1 us then, the order
  // of a shared-memory message, rather than refusing to tune (seen on a fresh CI clone).
  if (us >= 0) us = std::max(us, 1.0);
  if (gbs <= 0 || us <= 0) throw UserError("strata tune could not measure the collectives with `strata doctor -n " + std::to_string(ranks) + "`:\n" + output);
  rates.bytes_per_s = gbs * 1e9, rates.message_latency_s = us * 1e-6;
  rates.process_bytes = std::max(rates.process_bytes, start_mib * (1 << 20));  // a rank also holds MPI's buffers
  return rates;
}

}  // namespace strata
