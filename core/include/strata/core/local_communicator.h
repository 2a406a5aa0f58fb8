// The communicator of a one-rank world: every collective is complete at once.
#pragma once

#include "strata/comm.h"

namespace strata {

STRATA_API std::shared_ptr<Communicator> local_communicator();

}  // namespace strata
