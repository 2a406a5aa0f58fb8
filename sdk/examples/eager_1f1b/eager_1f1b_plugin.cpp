// Eager 1F1B: 1F1B with `extra` more warm-up forwards per rank. Each rank then holds one more
// micro-batch's activations than 1F1B (at most p - r + extra), and in exchange the next
// forward's input is already on its way while a backward runs, which hides point-to-point
// latency on slow links. The schedule only lists each rank's compute actions; core adds the
// sends and receives and refuses the list, before training, if it could deadlock.
#include <algorithm>

#include "strata/pipeline.h"
#include "strata/plugin.h"

namespace {

using strata::pipeline::Action;
using strata::pipeline::ActionKind;
using strata::pipeline::Programs;
using strata::pipeline::ScheduleShape;

class Eager1F1B final : public strata::pipeline::Schedule {
 public:
  static constexpr int extra = 1;
  Eager1F1B()
      : Schedule({strata::ComponentKind::Schedule, "eager_1f1b",
                  "1F1B with one more warm-up forward per rank (sdk/examples/eager_1f1b): at most p - r + 1 in flight",
                  {}}) {}
  int chunks(int) const override { return 1; }
  Programs compute_order(const ScheduleShape& s) const override {
    Programs out(static_cast<size_t>(s.ranks));
    for (int rank = 0; rank < s.ranks; ++rank) {
      auto& program = out[static_cast<size_t>(rank)];
      const int m = s.micro_batches, warmup = std::min(s.ranks - rank - 1 + extra, m);
      int forward = 0, backward = 0;
      for (; forward < warmup; ++forward) program.push_back({ActionKind::Forward, forward, 0});
      while (backward < m) {
        if (forward < m) program.push_back({ActionKind::Forward, forward++, 0});
        program.push_back({ActionKind::Backward, backward++, 0});
      }
    }
    return out;
  }
  std::string bubble_formula(const ScheduleShape& s) const override {
    return "as 1F1B: (p-1)/(m+p-1) = " + std::to_string(static_cast<double>(s.ranks - 1) / (s.micro_batches + s.ranks - 1));
  }
};

void register_components(strata::Registry& registry) { registry.add(std::make_unique<Eager1F1B>()); }

}  // namespace

STRATA_PLUGIN("eager_1f1b", "0.1.0", register_components)
