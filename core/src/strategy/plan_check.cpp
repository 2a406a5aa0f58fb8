// One plan-time check for every way in (strata plan, strata run, strata tune's candidates, the
// library API): the strategy resolved against the plugins, its passes ordered, their claims on
// the mesh checked, no key left unread by another's setting, every size a rank checks before
// training, and the data against the model (strata/core/strategy.h).
#include "strata/core/pass_manager.h"
#include "strata/core/strategy.h"

#include "unread_keys.h"

namespace strata {

bool check_plan(const RawStrategy& raw, const ComponentRegistry& registry, int64_t world_size, CheckedPlan& out,
                Diagnostics& diagnostics) {
  out.plan = resolve_strategy(raw, registry, world_size, diagnostics);
  out.order = order_passes(out.plan.passes, diagnostics);
  check_claims(out.plan, registry, diagnostics);
  check_unread_keys(out.plan, diagnostics, out.unread_notes);
  const bool resolved = diagnostics.ok();  // the sizes and data of a strategy with errors mean nothing
  check_sizes(out.plan, diagnostics);
  if (resolved) out.data_not_checked = check_data(out.plan, diagnostics);
  return diagnostics.ok();
}

}  // namespace strata
