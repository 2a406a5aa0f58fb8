// The collective flight recorder. Every communicator of a supervised rank is wrapped so that each
// operation it issues is numbered within its group and written, with its kind, size and step, to
// the rank's progress file (strata/core/progress.h) when issued and again when its wait()
// returns. After a hang the supervisor reads every rank's record and names the collective: the
// one some ranks wait in, and the ranks of that group that never issued it, or issued another
// operation under the same number (a desynchronised program).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "strata/comm.h"
#include "strata/core/progress.h"
#include "strata/export.h"

namespace strata {

// `world` wrapped to record into `beacon`; its splits (the topology's groups, and groups plugins
// split further) are wrapped too. Without a supervisor (an inert beacon) `world` comes back as is.
STRATA_API std::shared_ptr<Communicator> record_collectives(std::shared_ptr<Communicator> world, ProgressBeacon& beacon);
// Names a recorded group by what it spans ("data", "tensor+pipeline"); no-op on other communicators.
STRATA_API void label_group(Communicator& group, const std::string& label);

// What the flight records say about a hang.
struct CollectiveDiagnosis {
  std::vector<int> culprits;  // ranks blamed, ascending; empty when the records name none
  std::string cause;          // one clause: "rank 1 has not issued all_reduce #12 of group ...", or empty
};
// `files[r]` is rank r's progress file; `present[r]` whether it could be read.
STRATA_API CollectiveDiagnosis diagnose_collectives(const std::vector<ProgressFile>& files, const std::vector<bool>& present);
// Every rank's groups and last `last` operations, oldest first, as a JSON array (the flight record
// the supervisor writes after a hang).
STRATA_API std::string flight_record_json(const std::vector<ProgressFile>& files, const std::vector<bool>& present, int last = 32);

}  // namespace strata
