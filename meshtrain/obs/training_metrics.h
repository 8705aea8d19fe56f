// The metric set of a training run: what the trainer updates once per step, once per evaluation
// and once per checkpoint. Metric names and labels here are an interface (dashboards and alerts
// are written against them); extend, do not rename:
//
//   meshtrain_step_duration_seconds           histogram  wall time of a step (p50/p95/p99 via
//                                                        histogram_quantile)
//   meshtrain_step_phase_seconds{phase}       gauge      last step's time in data, forward,
//                                                        backward, comm (exposed), optimizer
//   meshtrain_step_phase_seconds_total{phase} counter    the same, accumulated
//   meshtrain_steps_total, meshtrain_skipped_steps_total, meshtrain_step
//   meshtrain_samples_total, meshtrain_tokens_total  counters (global batch)
//   meshtrain_samples_per_second, meshtrain_tokens_per_second  gauges (global, last step)
//   meshtrain_model_flops_per_second          gauge      this rank's achieved model FLOP/s
//   meshtrain_model_flops_utilization_ratio   gauge      the same over the configured peak (only
//                                                        when a peak is configured)
//   meshtrain_loss, meshtrain_val_loss, meshtrain_learning_rate, meshtrain_grad_norm,
//   meshtrain_loss_scale                      gauges
//   meshtrain_eval_duration_seconds           histogram
//   meshtrain_checkpoint_duration_seconds     histogram
//   meshtrain_checkpoint_bytes_total          counter
//   meshtrain_checkpoints_total{outcome}      counter    outcome = success | failure
//   meshtrain_restarts                        gauge      TORCHELASTIC_RESTART_COUNT
//   meshtrain_straggler_rank, meshtrain_straggler_lag_seconds  gauges (see on_rank_step_times)
//   meshtrain_world_size, meshtrain_rss_bytes gauges
//   meshtrain_gpu_utilization_ratio, meshtrain_gpu_memory_utilization_ratio,
//   meshtrain_gpu_memory_used_bytes, meshtrain_gpu_memory_total_bytes, meshtrain_gpu_power_watts,
//   meshtrain_gpu_temperature_celsius, meshtrain_gpu_ecc_uncorrected_errors,
//   meshtrain_gpu_last_xid                    gauges     (training on a GPU, NVML present;
//   meshtrain_gpu_xid_errors_total            counter     sampled at most once a second)
//   meshtrain_layer_grad_norm{layer}          gauge      with train.log_layer_norms
//                                                        (layer_norm_metrics.h)
//
// The job-level indicators (resumes, time to recover, rollbacks, completion, checkpoint age,
// throughput baseline) are in job_metrics.h.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/obs/metrics.h"
#include "meshtrain/obs/phase_clock.h"

namespace meshtrain::obs {

struct TrainingMetricsOptions {
  int rank = 0;
  int world_size = 1;
  double samples_per_step = 0;  // global batch, in sequences
  double tokens_per_step = 0;   // global batch, in tokens
  double flops_per_token = 0;   // forward + backward model FLOPs per token (GPTConfig)
  // Peak FLOP/s of one rank's device, for MFU; 0 = unknown, MFU not exported.
  double peak_flops = 0;
  int restart_count = 0;  // the launcher's TORCHELASTIC_RESTART_COUNT
  // The CUDA device this rank trains on, for GPU telemetry through NVML (gpu_telemetry.h);
  // -1: none. nvml_library overrides the library loaded (tests).
  int gpu_index = -1;
  std::string nvml_library;
};

struct StepStats {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_s = 0;
  bool skipped = false;
  double loss_scale = 1.0;
};

class TrainingMetrics {
 public:
  TrainingMetrics(Registry& registry, TrainingMetricsOptions options);
  ~TrainingMetrics();
  TrainingMetrics(const TrainingMetrics&) = delete;
  TrainingMetrics& operator=(const TrainingMetrics&) = delete;
  // Why GPU telemetry is off on a GPU rank (empty when it is on, or on the CPU).
  const std::string& gpu_telemetry_off_reason() const { return gpu_off_reason_; }

  // Updates the per-step metrics and adds the breakdown to `row` (the metrics.jsonl line):
  // data_s, forward_s, backward_s, comm_s, optimizer_s, samples_per_s, rss_bytes, and
  // model_flops_per_s / mfu where known.
  void on_step(const StepStats& stats, const PhaseClock& phases, nlohmann::json& row);
  void on_eval(double val_loss, double seconds);
  void on_checkpoint(double seconds, int64_t bytes, bool ok);
  // The step times of every rank for one step, as already exchanged by the data-parallel layer
  // (no extra synchronisation): exports the slowest rank and its lag behind the median rank
  // (the lower median, so that with two ranks the lag is the gap between them).
  struct Straggler {
    int rank = 0;
    double lag_s = 0;
  };
  Straggler on_rank_step_times(const std::vector<double>& step_s);

  const TrainingMetricsOptions& options() const { return options_; }

 private:
  TrainingMetricsOptions options_;
  Histogram& step_duration_;
  std::array<Gauge*, kNumPhases> phase_last_{};
  std::array<Counter*, kNumPhases> phase_total_{};
  Counter& steps_;
  Counter& skipped_;
  Gauge& step_;
  Counter& samples_;
  Counter& tokens_;
  Gauge& samples_per_s_;
  Gauge& tokens_per_s_;
  Gauge& flops_per_s_;
  Gauge* mfu_ = nullptr;
  Gauge& loss_;
  Gauge& val_loss_;
  Gauge& lr_;
  Gauge& grad_norm_;
  Gauge& loss_scale_;
  Gauge& rss_;
  Histogram& eval_duration_;
  Histogram& ckpt_duration_;
  Counter& ckpt_bytes_;
  Counter& ckpt_ok_;
  Counter& ckpt_failed_;
  Gauge& straggler_rank_;
  Gauge& straggler_lag_;

  // GPU telemetry, when training on a GPU whose driver's NVML loads.
  void sample_gpu(nlohmann::json& row);
  struct Gpu;
  std::unique_ptr<Gpu> gpu_;
  std::string gpu_off_reason_;
};

}  // namespace meshtrain::obs
