// Everything a training run needs from observability, behind one object that the trainer owns for
// the length of run(): the labelled metric set, the /metrics endpoint, the trace recorder and, in
// a multi-rank job, this rank's step-time history (metrics_rank<R>.jsonl) for the per-rank view
// of `meshtrain report`. Nothing here may stop training: an endpoint that cannot bind or a trace
// that cannot be written is a warning.
#pragma once

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/comm/collective_observer.h"
#include "meshtrain/obs/collective_metrics.h"
#include "meshtrain/obs/metrics_server.h"
#include "meshtrain/obs/phase_clock.h"
#include "meshtrain/obs/training_metrics.h"

namespace meshtrain::obs {

struct RunObserverOptions {
  std::filesystem::path out_dir;
  std::string trace_path;                       // "" = no trace; "{rank}" is replaced by the rank
  std::optional<MetricsServerOptions> metrics;  // nullopt = no endpoint
  TrainingMetricsOptions training;
};

// A trace path for one rank: "{rank}" replaced; in a multi-rank job without "{rank}", "_rank<R>"
// is inserted before the extension so ranks never overwrite each other's file.
std::string trace_path_for_rank(const std::string& path, int rank, int world_size);

class RunObserver {
 public:
  RunObserver(Registry& registry, RunObserverOptions options);
  ~RunObserver();  // stops the endpoint, writes the trace
  RunObserver(const RunObserver&) = delete;
  RunObserver& operator=(const RunObserver&) = delete;

  void on_step(const StepStats& stats, const PhaseClock& phases, nlohmann::json& row);
  void on_eval(double val_loss, double seconds);
  // Every rank's step time for this step, as exchanged with the loss (no extra collective):
  // updates the straggler gauges and adds slowest_rank, rank_lag_s and rank_step_s to `row`.
  void on_rank_step_times(const std::vector<double>& step_s, nlohmann::json& row);
  // Returns the event line for metrics.jsonl: {"event":"checkpoint", step, duration_s, bytes, ok}.
  nlohmann::json on_checkpoint(int64_t step, double seconds, int64_t bytes, bool ok);

  TrainingMetrics& metrics() { return metrics_; }
  // "" when no endpoint is serving.
  std::string metrics_url() const;
  std::string trace_file() const { return trace_file_; }
  // Writes the trace now (also done by the destructor); false with a warning on failure.
  bool write_trace();

 private:
  void on_collective(const comm::CollectiveEvent& e);

  RunObserverOptions options_;
  TrainingMetrics metrics_;
  std::unique_ptr<MetricsServer> server_;
  std::string trace_file_;
  std::ofstream rank_log_;
  // Every collective of this process feeds count, bytes and latency by operation; declared last
  // so the hook is removed before the metrics it writes to go away.
  CollectiveMetrics collectives_;
  comm::ScopedCollectiveObserver collective_hook_;
};

}  // namespace meshtrain::obs
