// Times attention on CPU, forward alone and forward + backward, for one shape and mask: the
// blocked kernel of attention.fused_cpu (kernels/cpu/attention.cpp, called directly so that its
// own speed shows even where the operator delegates to ATen), ATen's
// at::scaled_dot_product_attention (a boolean [B, 1, T, T] mask where the mask is not plain
// causal), and core's attention.reference without and with lse (with lse is what context
// parallel's ring calls). Prints one JSON object per line; bench/attention.py tabulates.
//
// usage: strata_bench_attention B H T D MASK REPS THREADS [ONLY]    (MASK: causal | documents;
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
#include "strata/core/operator_table.h"

namespace {

using namespace strata;

double median_ms(const std::function<void()>& run, int reps) {
  run();  // warm-up
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

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
  for (const auto& [name, attend] : impls) {
    if (name.rfind(only, 0) != 0) continue;
    const double forward = median_ms(
        [&] {
          at::NoGradGuard no_grad;
          attend(q, k, v);
        },
        reps);
    at::Tensor qg = q.clone().requires_grad_(true), kg = k.clone().requires_grad_(true), vg = v.clone().requires_grad_(true);
    const double both = median_ms(
        [&] {
          at::Tensor loss = (attend(qg, kg, vg) * w).sum();
          torch::autograd::grad({loss}, {qg, kg, vg});
        },
        reps);
    std::printf("{\"impl\": \"%s\", \"forward_ms\": %.4f, \"forward_backward_ms\": %.4f}\n", name.c_str(), forward, both);
    std::fflush(stdout);
  }
  return 0;
}
