// The job-level indicators (SLIs) that an operations team watches for a training job, beside the
// per-step metrics of TrainingMetrics. A job is many processes over its life (a crash, a
// preemption or an elastic round each start new ones), so rank 0 keeps what spans attempts in a
// small JSON file beside the checkpoints (<checkpoint root>/job_state.json) and carries it
// forward: its counters keep rising over restarts instead of starting again at 0, which a
// scrape of the same target could not tell from no change. Names and labels are an interface
// (deploy/prometheus/meshtrain-rules.yaml and docs/alerts.md use them):
//
//   rank 0 only, carried over attempts:
//   meshtrain_resumes_total{outcome}             counter  success: an attempt resumed from a
//                                                         checkpoint; failure: checkpoints were
//                                                         there but none could be loaded (it
//                                                         started again from step 0)
//   meshtrain_recovery_duration_seconds          gauge    the last resume's time to recover: from
//                                                         the previous attempt's last completed
//                                                         step to this attempt's first one
//   meshtrain_rollbacks_total                    counter  rollbacks to a checkpoint (non-finite
//                                                         steps)
//   meshtrain_job_completed                      gauge    1 once the job trained its last step
//   meshtrain_last_checkpoint_timestamp_seconds  gauge    Unix time of the newest successful
//                                                         checkpoint (0: none yet)
//   meshtrain_last_checkpoint_step               gauge    its step
//   every rank, this process:
//   meshtrain_last_step_timestamp_seconds        gauge    Unix time of the last completed step
//   meshtrain_tokens_per_second_baseline         gauge    median tokens/s of the last
//                                                         `baseline_window` steps
//   meshtrain_checkpoints_total{outcome}, meshtrain_checkpoint_duration_seconds,
//   meshtrain_checkpoint_bytes_total             the periodic checkpoints (see training_metrics.h)
//
// The previous attempt's last step is known to within `persist_interval_s` (the file is not
// rewritten more often), so a time to recover is over-estimated by at most that much; when rank 0
// moved to another host, the two hosts' clock difference is in it too.
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/obs/metrics.h"

namespace meshtrain::obs {

// What rank 0 carries from one attempt of a job to the next.
struct JobState {
  int64_t resumes_success = 0;
  int64_t resumes_failure = 0;
  int64_t rollbacks = 0;
  int64_t last_step = 0;
  double last_step_unix_s = 0;
  int64_t last_checkpoint_step = 0;
  double last_checkpoint_unix_s = 0;
  double last_recovery_s = -1;  // -1: never resumed
  bool completed = false;

  nlohmann::json to_json() const;
  // Missing keys keep their defaults (a file from an older version).
  static JobState from_json(const nlohmann::json& j);
  // Default when the file is missing; a file that does not parse is a warning naming it, and
  // the job goes on from the default (these are indicators, never a reason to stop training).
  static JobState load(const std::filesystem::path& path);
  // Written to a temporary file and renamed over `path`, so a reader never sees half a file;
  // false on failure, with the reason in `error`.
  bool save(const std::filesystem::path& path, std::string* error = nullptr) const;
};

struct JobMetricsOptions {
  int rank = 0;
  // <checkpoint root>/job_state.json; empty: nothing carried over (no checkpoints).
  std::filesystem::path state_file;
  bool fresh = false;  // a new job: an existing state file is not carried over (but replaced)
  double tokens_per_step = 0;    // global batch, in tokens
  size_t baseline_window = 100;  // steps
  double persist_interval_s = 1.0;
  // Unix time in seconds; replaceable for tests.
  std::function<double()> clock;
};

class JobMetrics {
 public:
  JobMetrics(Registry& registry, JobMetricsOptions options);
  JobMetrics(const JobMetrics&) = delete;
  JobMetrics& operator=(const JobMetrics&) = delete;

  // After the attempt looked for a checkpoint: `resumed_step` (0: none loaded); `failed`: there
  // were checkpoints but none could be loaded.
  void on_resume(int64_t resumed_step, bool failed);
  // After every completed step. Returns the time to recover on the first step after a resume
  // (nullopt otherwise, or when the previous attempt left no time to measure from).
  std::optional<double> on_step(int64_t step, double step_s);
  // A periodic checkpoint is over (any thread: the checkpoint writer's).
  void on_checkpoint(int64_t step, double seconds, uint64_t bytes, bool ok);
  void on_rollback();
  void on_completed(int64_t step);

  JobState state() const;
  double tokens_per_second_baseline() const;

 private:
  void persist_locked(bool force);
  void publish_locked();

  JobMetricsOptions options_;
  bool job_level_;  // rank 0
  mutable std::mutex mu_;
  JobState state_;
  double last_persist_s_ = -1e300;
  bool persist_ok_ = true;
  bool recovery_pending_ = false;
  double recovery_from_s_ = 0;
  std::deque<double> window_;
  // Registry-owned (they live as long as the registry); null where this rank does not export.
  Counter* resumes_ok_ = nullptr;
  Counter* resumes_failed_ = nullptr;
  Gauge* recovery_ = nullptr;
  Counter* rollbacks_ = nullptr;
  Gauge* completed_ = nullptr;
  Gauge* last_ckpt_time_ = nullptr;
  Gauge* last_ckpt_step_ = nullptr;
  Gauge& last_step_time_;
  Gauge& baseline_;
  Counter& ckpt_ok_;
  Counter& ckpt_failed_;
  Histogram& ckpt_duration_;
  Counter& ckpt_bytes_;
};

}  // namespace meshtrain::obs
