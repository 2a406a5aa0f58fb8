// The plan-time check of the data against the model (strata/core/strategy.h: check_data): the
// dataset opened as a rank opens it, relative to the working directory, and checked by the same
// functions the sampler runs when training starts (sampler.h), so a plan that passes trains.
#include <filesystem>
#include <memory>

#include "engine/sampler.h"
#include "strata/core/strategy.h"
#include "strata/data.h"
#include "strata/errors.h"

namespace strata {

std::string check_data(const ResolvedStrategy& plan, Diagnostics& diagnostics) {
  if (!plan.dataset_component || !plan.model_component) return {};
  std::unique_ptr<TokenDataset> data;
  try {
    data = static_cast<const DatasetFactory*>(plan.dataset_component)->open(plan.data, DataContext{std::filesystem::current_path()});
  } catch (const UserError& e) {
    return e.what();
  }
  if (plan.model.has("vocab_size"))
    if (const std::string problem = engine::vocabulary_problem(*data, plan.model.get_int("vocab_size")); !problem.empty())
      diagnostics.error(plan.model.entry("vocab_size").pos, problem);
  if (plan.model.has("seq_len"))
    if (const std::string problem = engine::too_short_for_windows(*data, plan.model.get_int("seq_len")); !problem.empty())
      diagnostics.error(plan.data_pos, problem);
  return {};
}

}  // namespace strata
