// A parameter-server worker's view of its steps as metrics, from the step's sync metrics ("ps":
// parallel/param_server/ps_client.h): on the step's metrics.jsonl line as the object "ps", and as
// meshtrain_ps_staleness (histogram: steps this worker ran ahead of the slowest when its gradient
// was applied), meshtrain_ps_version (updates the first server applied so far),
// meshtrain_ps_dropped_gradients_total (left out by backup workers; their batches trained
// again), meshtrain_ps_push_bytes_total, meshtrain_ps_pull_bytes_total and
// meshtrain_ps_push_pull_seconds (histogram: from the push to the last reply).
#pragma once

#include <nlohmann/json.hpp>

#include "meshtrain/obs/metrics.h"

namespace meshtrain::obs {

class ParamServerMetrics {
 public:
  explicit ParamServerMetrics(Registry& registry) : registry_(registry) {}
  // `sync` is the step's sync metrics (null or without "ps": nothing to do).
  void on_step(const nlohmann::json& sync, nlohmann::json& row);

 private:
  Registry& registry_;
};

}  // namespace meshtrain::obs
