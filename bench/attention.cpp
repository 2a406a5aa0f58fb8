// Times attention on CPU, forward alone and forward + backward, for one shape and mask: the
// blocked kernel of attention.fused_cpu (kernels/cpu/attention.cpp, called directly so that its
// own speed shows even where the operator delegates to ATen), ATen's
// at::scaled_dot_product_attention (a boolean [B, 1, T, T] mask where the mask is not plain
// causal), and core's attention.reference without and with lse (with lse is what context
// parallel's ring calls). Rounds are interleaved (each round times every implementation once);
// medians of the rounds, and the peak bytes of tensors one call allocates beyond those live
// before it (core/include/strata/core/counting_cpu_allocator.h). Prints one JSON object per line; bench/attention.py tabulates.
//
// usage: strata_bench_attention B H T D MASK REPS THREADS [ONLY]    (MASK: causal | documents | window:N;
//        ONLY: run only the implementations whose name starts with it, e.g. "fused" to profile it)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include "cpu/attention.h"
#include "strata/core/counting_cpu_allocator.h"
#include "strata/core/operator_table.h"
#include "cpu_timing.h"

using strata::bench::median;
using strata::bench::ms_of;

namespace {

using namespace strata;

// Documents of 64..T/2 tokens (a packed batch), different in each row.
at::Tensor documents(int64_t batch, int64_t t) {
  at::Tensor docs = at::empty({batch, t}, at::kLong);
  auto acc = docs.accessor<int64_t, 2>();
  for (int64_t b = 0; b < batch; ++b) {
    int64_t id = 0, left = 64 + (b * 37) % std::max<int64_t>(1, t / 2 - 64);
    for (int64_t i = 0; i < t; ++i) {
      acc[b][i] = id;
      if (--left == 0) {
        ++id;
        left = 64 + (i * 53 + b * 11) % std::max<int64_t>(1, t / 2 - 64);
      }
    }
  }
  return docs;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8 && argc != 9) {
    std::fprintf(stderr, "usage: strata_bench_attention B H T D MASK REPS THREADS [ONLY]\n");
    return 2;
  }
  const int64_t b = std::stoll(argv[1]), h = std::stoll(argv[2]), t = std::stoll(argv[3]), d = std::stoll(argv[4]);
  const std::string mask_name = argv[5];
  const int reps = std::stoi(argv[6]);
  const std::string only = argc == 9 ? argv[8] : "";
  at::set_num_threads(std::stoi(argv[7]));
  at::globalContext().setFlushDenormal(true);
  at::manual_seed(0);
  OperatorTable::global().reset();
  const auto& reference =
      static_cast<const ops::OperatorImpl<ops::Attention>&>(*OperatorTable::global().implementations("attention").back());

  ops::AttentionMask mask;
  mask.causal = true;
  at::Tensor sdpa_mask;  // what ATen needs for this mask: none for plain causal
  if (mask_name == "documents") {
    mask.q_document = mask.kv_document = documents(b, t);
    const at::Tensor same = mask.q_document.unsqueeze(2).eq(mask.kv_document.unsqueeze(1));
    sdpa_mask = same.logical_and(at::ones({t, t}, at::kBool).tril()).unsqueeze(1);  // [B, 1, T, T]
  } else if (mask_name.rfind("window:", 0) == 0) {  // causal within a sliding window of N tokens
    mask.sliding_window = std::stoll(mask_name.substr(7));
    const at::Tensor i = at::arange(t).unsqueeze(1), j = at::arange(t).unsqueeze(0);
    sdpa_mask = j.le(i).logical_and(j.gt(i - mask.sliding_window)).view({1, 1, t, t});
  } else if (mask_name != "causal") {
    std::fprintf(stderr, "unknown mask %s\n", mask_name.c_str());
    return 2;
  }
  at::Tensor q = at::randn({b, h, t, d}), k = at::randn({b, h, t, d}), v = at::randn({b, h, t, d});
  const at::Tensor w = at::randn({b, h, t, d});

  using Attend = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;
  const std::vector<std::pair<std::string, Attend>> impls{
      {"fused", [&](auto& q_, auto& k_, auto& v_) { return kernels::attention_blocked_cpu(q_, k_, v_, mask, false).out; }},
      {"fused (with lse)", [&](auto& q_, auto& k_, auto& v_) {
         auto r = kernels::attention_blocked_cpu(q_, k_, v_, mask, true);
         return r.out + 0.0 * r.lse.unsqueeze(-1);  // lse joins the graph, as in ring attention
       }},
      {"aten sdpa", [&](auto& q_, auto& k_, auto& v_) {
         if (sdpa_mask.defined()) return at::scaled_dot_product_attention(q_, k_, v_, sdpa_mask, 0.0, false);
         return at::scaled_dot_product_attention(q_, k_, v_, std::nullopt, 0.0, true);
       }},
      {"reference", [&](auto& q_, auto& k_, auto& v_) { return reference.fn()(q_, k_, v_, mask, false).out; }},
      {"reference (with lse)", [&](auto& q_, auto& k_, auto& v_) {
         auto r = reference.fn()(q_, k_, v_, mask, true);
         return r.out + 0.0 * r.lse.unsqueeze(-1);
       }},
  };
  // Each implementation's two measurements: forward under no_grad, and forward+backward.
  struct Runs {
    std::function<void()> forward, both;
    std::vector<double> forward_ms, both_ms;
    int64_t forward_peak = 0, both_peak = 0;  // bytes allocated beyond what was live before
  };
  CountingCpuAllocator& memory = CountingCpuAllocator::install();
  at::Tensor qg = q.clone().requires_grad_(true), kg = k.clone().requires_grad_(true), vg = v.clone().requires_grad_(true);
  std::vector<std::pair<std::string, Runs>> runs;
  for (const auto& [name, attend] : impls) {
    if (name.rfind(only, 0) != 0) continue;
    Runs r;
    r.forward = [&, attend = attend] {
      at::NoGradGuard no_grad;
      attend(q, k, v);
    };
    r.both = [&, attend = attend] {
      at::Tensor loss = (attend(qg, kg, vg) * w).sum();
      torch::autograd::grad({loss}, {qg, kg, vg});
    };
    runs.emplace_back(name, std::move(r));
  }
  // Peak bytes of one call each (after a warm-up call), then timed rounds that take every
  // implementation in turn, so that a slow spell of the shared machine hits them alike.
  for (auto& [name, r] : runs) {
    for (auto [fn, peak] : {std::pair{&r.forward, &r.forward_peak}, std::pair{&r.both, &r.both_peak}}) {
      (*fn)();
      const int64_t before = memory.current();
      memory.reset_peak();
      (*fn)();
      *peak = memory.peak() - before;
    }
  }
  for (int round = 0; round < reps; ++round)
    for (auto& [name, r] : runs) {
      r.forward_ms.push_back(ms_of(r.forward));
      r.both_ms.push_back(ms_of(r.both));
    }
  for (const auto& [name, r] : runs) {
    std::printf("{\"impl\": \"%s\", \"forward_ms\": %.4f, \"forward_backward_ms\": %.4f, \"forward_peak_bytes\": %lld, "
                "\"forward_backward_peak_bytes\": %lld}\n",
                name.c_str(), median(r.forward_ms), median(r.both_ms), static_cast<long long>(r.forward_peak),
                static_cast<long long>(r.both_peak));
    std::fflush(stdout);
  }
  return 0;
}
