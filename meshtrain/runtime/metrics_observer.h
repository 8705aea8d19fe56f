// The run's measurements: metrics.jsonl on rank 0 (one row per step, appended to when the run
// resumed), the Prometheus registry and trace of obs::RunObserver, per-layer gradient norms, and
// the job-level indicators (recovery time after a restart, completion).
#pragma once

#include <fstream>
#include <memory>

#include "meshtrain/obs/layer_norm_metrics.h"
#include "meshtrain/obs/moe_metrics.h"
#include "meshtrain/obs/param_server_metrics.h"
#include "meshtrain/obs/run_observer.h"
#include "meshtrain/runtime/step_observer.h"

namespace meshtrain::runtime {

class MetricsObserver : public StepObserver {
 public:
  // Opens metrics.jsonl on rank 0; IoError when it cannot be written.
  MetricsObserver(RunState& run, obs::RunObserverOptions options);
  // Starts the metrics endpoint and the trace.
  void on_start(RunState& run) override;
  void after_step(RunState& run, StepContext& step) override;
  void on_end(RunState& run) override;

  // One row of metrics.jsonl (rank 0; nothing elsewhere).
  void write(const nlohmann::json& row, bool flush = false);
  obs::RunObserver& run_observer() { return *observer_; }

 private:
  obs::RunObserverOptions options_;
  std::ofstream file_;
  std::unique_ptr<obs::RunObserver> observer_;
  std::unique_ptr<obs::LayerNormMetrics> layer_norms_;
  std::unique_ptr<obs::MoEMetrics> moe_;
  std::unique_ptr<obs::ParamServerMetrics> param_server_;
};

}  // namespace meshtrain::runtime
