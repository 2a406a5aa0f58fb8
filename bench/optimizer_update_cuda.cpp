// Time of one optimizer update over a GPT's worth of fp32 parameters on a GPU (the shapes of
// bench/adamw_update.cpp's GPT-2 blocks: small = 6 x 384, medium = 8 x 512, gpt2 = 12 x 768,
// vocab 4096/4096/50257): AGD's agd_update.fused_cuda (kernels/cuda/agd_kernels.cu, one kernel per
// parameter) against agd_update.reference, and AdamW's adamw_update.fused_cuda given the whole
// group (multi-tensor launches, what the optimizer does) against it given one parameter at a
// time and against adamw_update.reference. Host time included: CUDA events around the whole
// update, so launch overhead counts as it does in a step. Rounds interleaved, median of rounds.
//
// usage: strata_bench_optimizer_update_cuda [ROUNDS]
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "cuda/adamw_fused.h"
#include "cuda/agd_cuda.h"
#include "cuda_timing.h"
#include "strata/core/operator_table.h"

int main(int argc, char** argv) {
  using namespace strata;
#ifndef STRATA_HAVE_CUDA_KERNELS
  std::fprintf(stderr, "strata_bench_optimizer_update_cuda: built without nvcc\n");
  return 2;
#else
  if (!at::hasCUDA()) {
    std::fprintf(stderr, "strata_bench_optimizer_update_cuda: no CUDA device\n");
    return 2;
  }
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const auto& agd_reference =
      static_cast<const ops::OperatorImpl<ops::AgdUpdate>&>(*OperatorTable::global().implementations("agd_update").back()).fn();
  const auto& adamw_reference =
      static_cast<const ops::OperatorImpl<ops::AdamwUpdate>&>(*OperatorTable::global().implementations("adamw_update").back()).fn();
  std::printf("| model | parameters | tensors | update | ms (median of %d) | vs reference |\n|---|---|---|---|---|---|\n", rounds);
  struct Model {
    const char* name;
    int64_t layers, d, vocab;
  };
  for (const Model& model : {Model{"small", 6, 384, 4096}, Model{"medium", 8, 512, 4096}, Model{"gpt2", 12, 768, 50257}}) {
    const int64_t d = model.d;
    std::vector<std::vector<int64_t>> shapes{{model.vocab, d}, {1024, d}};
    for (int64_t l = 0; l < model.layers; ++l)
      for (auto s : std::vector<std::vector<int64_t>>{{3 * d, d}, {3 * d}, {d, d}, {d}, {4 * d, d}, {4 * d}, {d, 4 * d}, {d}, {d}, {d}, {d}, {d}})
        shapes.push_back(s);
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
    std::vector<at::Tensor> p, g, m, v;
    int64_t count = 0;
    for (const auto& s : shapes) {
      p.push_back(at::randn(s, opts)), g.push_back(at::randn(s, opts)), m.push_back(at::zeros(s, opts)), v.push_back(at::zeros(s, opts));
      count += p.back().numel();
    }
    ops::AgdHyper agd;
    agd.lr = 1e-4, agd.weight_decay = 0.1;
    ops::AdamwHyper adamw{1e-3, 0.9, 0.95, 1e-8, 0.1, 1};
    using Update = std::function<void()>;
    const std::vector<std::pair<std::string, Update>> updates{
        {"agd fused_cuda", [&] { for (size_t i = 0; i < p.size(); ++i) kernels::agd_update_fused_cuda(p[i], g[i], m[i], v[i], {}, {}, agd); }},
        {"agd reference", [&] { for (size_t i = 0; i < p.size(); ++i) agd_reference(p[i], g[i], m[i], v[i], {}, {}, agd); }},
        {"adamw fused_cuda, the group", [&] { kernels::adamw_update_fused_cuda(p, g, m, v, adamw); }},
        {"adamw fused_cuda, per parameter", [&] { for (size_t i = 0; i < p.size(); ++i) kernels::adamw_update_fused_cuda(p[i], g[i], m[i], v[i], adamw); }},
        {"adamw reference", [&] { adamw_reference(p, g, m, v, adamw); }}};
    std::vector<std::vector<double>> ms(updates.size());
    for (int r = -1; r < rounds; ++r)  // round -1 warms up
      for (size_t i = 0; i < updates.size(); ++i) {
        const double t = bench::time_on_gpu(updates[i].second).ms;
        if (r >= 0) ms[i].push_back(t);
        ++agd.step, ++adamw.step;
      }
    for (size_t i = 0; i < updates.size(); ++i) {
      const size_t reference = i < 2 ? 1 : 4;
      std::printf("| %s | %.2f M | %zu | %s | %.3f | %.2fx |\n", model.name, static_cast<double>(count) / 1e6, p.size(),
                  updates[i].first.c_str(), bench::median(ms[i]), bench::median(ms[i]) / bench::median(ms[reference]));
    }
    std::fflush(stdout);
  }
  return 0;
#endif
}
