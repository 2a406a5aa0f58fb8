// Where this rank runs: its place in the [parallel] mesh, with the communicators, and its device.
#pragma once

#include <memory>
#include <string>

#include <c10/core/Device.h>

#include "strata/core/component_registry.h"
#include "strata/core/launch_env.h"
#include "strata/core/progress.h"
#include "strata/core/strategy.h"
#include "strata/topology.h"

namespace strata::engine {

// The topology of [parallel] over this process's rank, with its communicators: the configured
// backend's when there are several ranks, a local one otherwise. Every operation is recorded in
// `progress` (which must outlive the communicators) for the supervisor's hang reports.
std::shared_ptr<Topology> make_topology(const ResolvedStrategy& plan, const ComponentRegistry& registry, const LaunchEnv& env,
                                        ProgressBeacon& progress);

// "cuda" without an index means this rank's device: the local rank's, round robin over the
// node's devices, so that the ranks of a node do not all use cuda:0.
c10::Device parse_device(const std::string& text, int local_rank);

}  // namespace strata::engine
