// Replays a job trace on a cluster under one placement policy and reports what that policy
// costs: device utilisation, queue wait and the bytes per step that cross nodes and racks
// (from each job's layout, through the time model's traffic volumes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/plan/placement.h"

namespace meshtrain::plan {

struct TraceJob {
  JobRequest request;
  double arrival = 0;   // seconds
  double duration = 0;  // seconds of running, wherever placed
};

// A seeded mix of jobs from one device (GPT-2 124M data-parallel) to 128 (a 70B model with
// tp 8 x pp 8 x dp 2), arriving as a Poisson process that offers `load` times the devices.
std::vector<TraceJob> synthetic_trace(int64_t jobs, uint64_t seed, double load,
                                      int64_t cluster_devices);

struct SimResult {
  std::string policy;
  int64_t jobs = 0;
  double makespan = 0;                 // first arrival to last completion, seconds
  double utilisation = 0;              // busy device-seconds / (devices x makespan)
  double mean_wait = 0, max_wait = 0;  // seconds queued
  // Summed over the trace's jobs, bytes per step of each as placed.
  double cross_node_bytes = 0, cross_rack_bytes = 0, total_bytes = 0;
};

// Jobs start in (priority, arrival) order, any queued job that fits may start (backfilling), and
// a job that never fits the empty cluster is a ValueError naming it.
SimResult simulate(const Inventory& inv, const std::vector<TraceJob>& trace, Policy policy);

std::string policy_name(Policy p);

}  // namespace meshtrain::plan
