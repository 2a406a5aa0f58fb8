#include "partition.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include "strata/errors.h"

namespace strata::pipeline {

namespace {
constexpr double kStateBytesPerParameter = 16.0;  // fp32 parameter, gradient and AdamW's two moments
}

Partition uniform_partition(size_t blocks, int stages) {
  Partition out;
  const size_t base = blocks / static_cast<size_t>(stages), extra = blocks % static_cast<size_t>(stages);
  size_t first = 0;
  for (int s = 0; s < stages; ++s) {
    const size_t size = base + (static_cast<size_t>(s) >= static_cast<size_t>(stages) - extra ? 1 : 0);
    out.push_back({first, first + size});
    first += size;
  }
  return out;
}

double stage_memory_bytes(const std::vector<BlockCost>& costs, StageBlocks stage, int in_flight) {
  double bytes = 0;
  for (size_t b = stage.first; b < stage.last; ++b)
    bytes += kStateBytesPerParameter * static_cast<double>(costs[b].params) + in_flight * costs[b].activation_bytes;
  return bytes;
}

Partition balanced_partition(const std::vector<BlockCost>& costs, const std::vector<int>& in_flight, double memory_cap_bytes) {
  const size_t n = costs.size(), stages = in_flight.size();
  if (stages == 0 || n < stages) return {};
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t b = 0; b < n; ++b) prefix[b + 1] = prefix[b] + costs[b].seconds;
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][j]: the smallest slowest-stage time putting blocks [0, j) on stages [0, s]; cut[s][j]
  // where stage s starts.
  std::vector<std::vector<double>> best(stages, std::vector<double>(n + 1, inf));
  std::vector<std::vector<size_t>> cut(stages, std::vector<size_t>(n + 1, 0));
  auto fits = [&](size_t s, size_t i, size_t j) {
    return memory_cap_bytes <= 0 || stage_memory_bytes(costs, {i, j}, in_flight[s]) <= memory_cap_bytes;
  };
  for (size_t j = 1; j <= n; ++j)
    if (fits(0, 0, j)) best[0][j] = prefix[j];
  for (size_t s = 1; s < stages; ++s)
    for (size_t j = s + 1; j <= n; ++j)
      for (size_t i = s; i < j; ++i) {
        if (best[s - 1][i] == inf || !fits(s, i, j)) continue;
        const double slowest = std::max(best[s - 1][i], prefix[j] - prefix[i]);
        if (slowest < best[s][j]) best[s][j] = slowest, cut[s][j] = i;
      }
  if (best[stages - 1][n] == inf) return {};
  Partition out(stages);
  size_t end = n;
  for (size_t s = stages; s-- > 0;) {
    const size_t start = s == 0 ? 0 : cut[s][end];
    out[s] = {start, end};
    end = start;
  }
  return out;
}

Partition layout_partition(const nn::Model& model, const std::vector<std::string>& layout, int stages, std::string& problem) {
  auto index_of = [&](const std::string& name) -> long {
    for (size_t b = 0; b < model.num_blocks(); ++b)
      if (model.block_name(b) == name) return static_cast<long>(b);
    return -1;
  };
  if (static_cast<int>(layout.size()) != stages) {
    problem = "layout has " + std::to_string(layout.size()) + " stages but the pipeline has " + std::to_string(stages) +
              " (pipeline x chunks)";
    return {};
  }
  std::vector<int> owner(model.num_blocks(), -1);
  Partition out;
  for (int s = 0; s < stages; ++s) {
    std::vector<size_t> blocks;
    std::istringstream words(layout[static_cast<size_t>(s)]);
    for (std::string word; words >> word;) {
      const size_t dots = word.find("..");
      const std::string from = word.substr(0, dots), to = dots == std::string::npos ? from : word.substr(dots + 2);
      const long a = index_of(from), b = index_of(to);
      if (a < 0 || b < 0) {
        problem = "layout stage " + std::to_string(s) + " names block '" + (a < 0 ? from : to) + "', which the model does not have";
        return {};
      }
      if (b < a) {
        problem = "layout stage " + std::to_string(s) + ": '" + word + "' runs backwards";
        return {};
      }
      for (long i = a; i <= b; ++i) blocks.push_back(static_cast<size_t>(i));
    }
    if (blocks.empty()) {
      problem = "layout stage " + std::to_string(s) + " has no blocks";
      return {};
    }
    for (size_t b : blocks) {
      if (owner[b] >= 0) {
        problem = "layout puts block '" + model.block_name(b) + "' in stage " + std::to_string(owner[b]) + " and again in stage " +
                  std::to_string(s);
        return {};
      }
      owner[b] = s;
    }
    std::sort(blocks.begin(), blocks.end());
    if (blocks.back() - blocks.front() + 1 != blocks.size() || (!out.empty() && blocks.front() != out.back().last)) {
      problem = "layout stage " + std::to_string(s) + " is not the run of blocks that follows stage " + std::to_string(s - 1) +
                " in model order";
      if (out.empty()) problem = "layout stage 0 must start with the model's first block '" + model.block_name(0) + "'";
      return {};
    }
    if (out.empty() && blocks.front() != 0) {
      problem = "layout stage 0 must start with the model's first block '" + model.block_name(0) + "'";
      return {};
    }
    out.push_back({blocks.front(), blocks.back() + 1});
  }
  for (size_t b = 0; b < owner.size(); ++b)
    if (owner[b] < 0) {
      problem = "layout leaves out block '" + model.block_name(b) + "'; every block must be in exactly one stage";
      return {};
    }
  return out;
}

std::vector<BlockCost> measure_blocks(nn::Model& model, int64_t micro_batch, int64_t heads, int repeats) {
  using clock = std::chrono::steady_clock;
  const int64_t seq_len = model.seq_len();
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor rng_state = generator.get_state();
  std::vector<BlockCost> costs(model.num_blocks());
  for (size_t b = 0; b < model.num_blocks(); ++b) {
    costs[b].name = model.block_name(b);
    costs[b].type = model.block(b).type();
    costs[b].seconds = std::numeric_limits<double>::infinity();
    for (const auto& p : model.block(b).parameters()) costs[b].params += p.numel();
  }
  const auto device = model.parameters().empty() ? at::Device(at::kCPU) : model.parameters().front().device();
  for (int rep = 0; rep < repeats; ++rep) {
    std::vector<at::Tensor> inputs, outputs;
    std::vector<double> seconds(model.num_blocks());
    at::Tensor x = at::randint(model.vocab_size(), {micro_batch, seq_len}, at::TensorOptions().dtype(at::kLong).device(device));
    for (size_t b = 0; b < model.num_blocks(); ++b) {
      const at::Tensor input = x.is_floating_point() ? x.detach().requires_grad_() : x;
      const auto start = clock::now();
      x = model.forward_blocks(b, b + 1, input);
      seconds[b] = std::chrono::duration<double>(clock::now() - start).count();
      inputs.push_back(input);
      outputs.push_back(x);
    }
    at::Tensor grad = at::full_like(outputs.back(), 1.0 / static_cast<double>(outputs.back().numel()));
    for (size_t b = model.num_blocks(); b-- > 0;) {
      const auto start = clock::now();
      torch::autograd::backward({outputs[b]}, {grad});
      seconds[b] += std::chrono::duration<double>(clock::now() - start).count();
      if (inputs[b].is_floating_point()) grad = inputs[b].grad();
    }
    for (size_t b = 0; b < model.num_blocks(); ++b) {
      costs[b].seconds = std::min(costs[b].seconds, seconds[b]);
      // Activation estimates per micro-batch: a transformer block keeps s b h (34 + 5 a s / h)
      // bytes at 16 bits (Korthikanti et al. 2022), twice that in fp32; the embedding keeps its
      // output, the head its logits and their softmax.
      const double out_bytes = static_cast<double>(outputs[b].numel()) * static_cast<double>(outputs[b].element_size());
      if (costs[b].type == "block") {
        const double h = static_cast<double>(outputs[b].size(-1)), s = static_cast<double>(seq_len);
        costs[b].activation_bytes = out_bytes / h / 4.0 * h * (34.0 + 5.0 * static_cast<double>(heads) * s / h) * 2.0;
      } else {
        costs[b].activation_bytes = costs[b].type == "head" ? 2.0 * out_bytes : out_bytes;
      }
    }
  }
  for (auto& p : model.parameters()) p.mutable_grad() = at::Tensor();
  generator.set_state(rng_state);
  return costs;
}

}  // namespace strata::pipeline
