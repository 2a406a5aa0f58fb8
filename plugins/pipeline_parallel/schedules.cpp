// The bundled schedules, each a function from (ranks p, micro-batches m, chunks v) to every
// rank's order of compute actions. Core adds the messages and proves the result by simulation.
#include "schedules.h"

#include <algorithm>
#include <cstdio>
#include <deque>

#include "strata/pipeline.h"

namespace strata::pipeline {
namespace {

std::string fraction(const char* formula, double value) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s = %.3f", formula, value);
  return buf;
}

// Idle fraction of the step for GPipe and 1F1B: (p - 1) / (m + p - 1).
std::string flush_bubble(const ScheduleShape& s) {
  return fraction("(p-1)/(m+p-1)", static_cast<double>(s.ranks - 1) / (s.micro_batches + s.ranks - 1));
}

// All forwards, then all backwards: m micro-batches' activations in flight.
class GPipe final : public Schedule {
 public:
  GPipe() : Schedule({ComponentKind::Schedule, "gpipe", "All forwards, then all backwards (GPipe); m micro-batches in flight", {}}) {}
  int chunks(int) const override { return 1; }
  Programs compute_order(const ScheduleShape& s) const override {
    Programs out(static_cast<size_t>(s.ranks));
    for (auto& program : out) {
      for (int m = 0; m < s.micro_batches; ++m) program.push_back({ActionKind::Forward, m, 0});
      for (int m = 0; m < s.micro_batches; ++m) program.push_back({ActionKind::Backward, m, 0});
    }
    return out;
  }
  std::string bubble_formula(const ScheduleShape& s) const override { return flush_bubble(s); }
};

// One forward, one backward (PipeDream-flush): rank r runs p - r - 1 warm-up forwards, then
// alternates, then drains; at most p - r micro-batches in flight. `split` divides each backward
// into its input and weight halves, back to back (the zero-bubble schedule starts from this).
std::vector<Action> one_f_one_b(int rank, const ScheduleShape& s) {
  std::vector<Action> program;
  const int m = s.micro_batches, warmup = std::min(s.ranks - rank - 1, m);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) program.push_back({ActionKind::Forward, next_forward, 0});
  while (next_backward < m) {
    if (next_forward < m) program.push_back({ActionKind::Forward, next_forward++, 0});
    program.push_back({ActionKind::Backward, next_backward++, 0});
  }
  return program;
}

class OneFOneB final : public Schedule {
 public:
  OneFOneB()
      : Schedule({ComponentKind::Schedule, "1f1b", "One forward, one backward (PipeDream-flush); at most p micro-batches in flight", {}}) {}
  int chunks(int) const override { return 1; }
  Programs compute_order(const ScheduleShape& s) const override {
    Programs out;
    for (int r = 0; r < s.ranks; ++r) out.push_back(one_f_one_b(r, s));
    return out;
  }
  std::string bubble_formula(const ScheduleShape& s) const override { return flush_bubble(s); }
};

// Megatron's interleaved 1F1B: v chunks per rank, micro-batches in groups of p through chunk 0,
// then the same group through chunk 1, ...; backwards the same with the chunks reversed.
class Interleaved final : public Schedule {
 public:
  Interleaved()
      : Schedule({ComponentKind::Schedule, "interleaved",
                  "Interleaved 1F1B (Megatron virtual pipeline): v chunks per rank, bubble (p-1)/(v m) of the ideal time; needs m % p == 0",
                  {}}) {}
  int chunks(int requested) const override { return requested == 0 ? 2 : requested; }
  std::string shape_problem(const ScheduleShape& s) const override {
    if (s.chunks < 2) return "needs chunks >= 2 (v model chunks per rank)";
    if (s.micro_batches % s.ranks != 0)
      return "needs the micro-batches per step (" + std::to_string(s.micro_batches) + ") to be a multiple of [parallel] pipeline = " +
             std::to_string(s.ranks);
    return {};
  }
  Programs compute_order(const ScheduleShape& s) const override {
    const int p = s.ranks, v = s.chunks, total = s.micro_batches * v;
    auto item = [&](int k, bool backward) {
      const int group = k / (p * v), within = k % (p * v);
      const int chunk = within / p;
      return Action{backward ? ActionKind::Backward : ActionKind::Forward, group * p + within % p, backward ? v - 1 - chunk : chunk};
    };
    Programs out;
    for (int r = 0; r < p; ++r) {
      std::vector<Action> program;
      const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
      int f = 0, b = 0;
      for (; f < warmup; ++f) program.push_back(item(f, false));
      while (b < total) {
        if (f < total) program.push_back(item(f++, false));
        program.push_back(item(b++, true));
      }
      out.push_back(std::move(program));
    }
    return out;
  }
  std::string bubble_formula(const ScheduleShape& s) const override {
    return fraction("(p-1)/(v m) of the ideal time", static_cast<double>(s.ranks - 1) / (s.chunks * s.micro_batches));
  }
};

// Zero bubble, ZB-H1 style (Qi et al. 2024): 1F1B's order of forwards and input gradients (B),
// with each weight gradient (W) deferred into the first slot where the rank would otherwise wait,
// and the rest after the last B. The slots are found by simulating the step with F = B = W = 1.
class ZeroBubble final : public Schedule {
 public:
  ZeroBubble()
      : Schedule({ComponentKind::Schedule, "zero_bubble",
                  "Zero bubble (ZB-H1): backward split into input and weight gradients, weight gradients run in 1F1B's bubbles", {}}) {}
  int chunks(int) const override { return 1; }
  Programs compute_order(const ScheduleShape& s) const override {
    const int p = s.ranks, m = s.micro_batches;
    std::vector<std::deque<Action>> order(static_cast<size_t>(p));
    for (int r = 0; r < p; ++r)
      for (Action a : one_f_one_b(r, s)) {
        if (a.kind == ActionKind::Backward) a.kind = ActionKind::BackwardInput;
        order[static_cast<size_t>(r)].push_back(a);
      }
    // finish[kind][rank][micro]: when that compute ends (-1 not yet); unit time steps.
    std::vector<std::vector<int>> forward_end(static_cast<size_t>(p), std::vector<int>(static_cast<size_t>(m), -1)),
        input_end = forward_end;
    std::vector<std::deque<int>> pending_w(static_cast<size_t>(p));
    std::vector<int> busy_until(static_cast<size_t>(p), 0);
    Programs out(static_cast<size_t>(p));
    size_t remaining = 0;
    for (const auto& o : order) remaining += o.size();
    for (int t = 0; remaining > 0 || std::any_of(pending_w.begin(), pending_w.end(), [](const auto& q) { return !q.empty(); }); ++t)
      for (int r = 0; r < p; ++r) {
        const auto ru = static_cast<size_t>(r);
        if (busy_until[ru] > t) continue;
        auto ready = [&](const Action& a) {
          if (a.kind == ActionKind::Forward) return r == 0 || (forward_end[ru - 1][static_cast<size_t>(a.micro)] >= 0 &&
                                                               forward_end[ru - 1][static_cast<size_t>(a.micro)] <= t);
          return r == p - 1 || (input_end[ru + 1][static_cast<size_t>(a.micro)] >= 0 && input_end[ru + 1][static_cast<size_t>(a.micro)] <= t);
        };
        if (!order[ru].empty() && ready(order[ru].front())) {
          const Action a = order[ru].front();
          order[ru].pop_front();
          --remaining;
          (a.kind == ActionKind::Forward ? forward_end : input_end)[ru][static_cast<size_t>(a.micro)] = t + 1;
          if (a.kind == ActionKind::BackwardInput) pending_w[ru].push_back(a.micro);
          out[ru].push_back(a);
        } else if (!pending_w[ru].empty()) {
          out[ru].push_back({ActionKind::BackwardWeight, pending_w[ru].front(), 0});
          pending_w[ru].pop_front();
        } else {
          continue;  // waits
        }
        busy_until[ru] = t + 1;
      }
    return out;
  }
  std::string bubble_formula(const ScheduleShape& s) const override {
    return "(p-1)(F+B-2W)/step, 0 when F = B = W: " + fraction("1F1B's (p-1)/(m+p-1)", static_cast<double>(s.ranks - 1) /
                                                                                           (s.micro_batches + s.ranks - 1)) +
           " before the weight gradients fill it";
  }
};

}  // namespace

void register_schedules(Registry& registry) {
  registry.add(std::make_unique<GPipe>());
  registry.add(std::make_unique<OneFOneB>());
  registry.add(std::make_unique<Interleaved>());
  registry.add(std::make_unique<ZeroBubble>());
}

}  // namespace strata::pipeline
