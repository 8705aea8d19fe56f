// See param_server_metrics.h.
#include "meshtrain/obs/param_server_metrics.h"

namespace meshtrain::obs {

void ParamServerMetrics::on_step(const nlohmann::json& sync, nlohmann::json& row) {
  if (!sync.is_object() || !sync.contains("ps")) return;
  const nlohmann::json& ps = sync["ps"];
  registry_
      .histogram("meshtrain_ps_staleness",
                 "Steps this worker ran ahead of the slowest worker when the servers applied its "
                 "gradient (0 in sync mode).",
                 {0, 1, 2, 3, 4, 6, 8, 16})
      .observe(ps["staleness"].get<double>());
  registry_.gauge("meshtrain_ps_version", "Updates the first parameter server applied so far.")
      .set(ps["version"].get<double>());
  if (ps["dropped"].get<bool>())
    registry_
        .counter("meshtrain_ps_dropped_gradients_total",
                 "Gradients of this worker the servers left out of their step (backup workers); "
                 "their batches were trained again.")
        .inc();
  registry_.counter("meshtrain_ps_push_bytes_total", "Gradient bytes pushed to the servers.")
      .inc(ps["push_bytes"].get<double>());
  registry_.counter("meshtrain_ps_pull_bytes_total", "Parameter bytes pulled from the servers.")
      .inc(ps["pull_bytes"].get<double>());
  registry_
      .histogram("meshtrain_ps_push_pull_seconds",
                 "From a step's push to the servers' last reply, seconds.",
                 {0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3})
      .observe(ps["push_pull_s"].get<double>());
  row["ps"] = ps;
}

}  // namespace meshtrain::obs
