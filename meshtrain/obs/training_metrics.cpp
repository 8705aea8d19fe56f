// See training_metrics.h. Every metric is looked up once, here; on_step only touches atomics.
#include "meshtrain/obs/training_metrics.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "meshtrain/obs/gpu_telemetry.h"
#include "meshtrain/obs/process_metrics.h"

namespace meshtrain::obs {

struct TrainingMetrics::Gpu {
  // Registers the GPU series: only for telemetry that is available.
  Gpu(Registry& r, std::unique_ptr<GpuTelemetry> t)
      : telemetry(std::move(t)),
        utilization(r.gauge("meshtrain_gpu_utilization_ratio",
                            "Share of the last sample period a kernel ran on this rank's GPU.")),
        memory_utilization(r.gauge("meshtrain_gpu_memory_utilization_ratio",
                                   "Share of the last sample period the GPU memory was busy.")),
        memory_used(
            r.gauge("meshtrain_gpu_memory_used_bytes", "GPU memory in use (all processes).")),
        memory_total(r.gauge("meshtrain_gpu_memory_total_bytes", "GPU memory.")),
        power(r.gauge("meshtrain_gpu_power_watts", "GPU power draw.")),
        temperature(r.gauge("meshtrain_gpu_temperature_celsius", "GPU temperature.")),
        ecc(r.gauge("meshtrain_gpu_ecc_uncorrected_errors",
                    "Uncorrected ECC errors since the driver loaded (-1: no ECC).")),
        last_xid(r.gauge("meshtrain_gpu_last_xid", "Code of the newest XID error, 0 if none.")),
        xid(r.counter("meshtrain_gpu_xid_errors_total", "XID errors the driver reported.")) {}
  std::unique_ptr<GpuTelemetry> telemetry;
  Gauge &utilization, &memory_utilization, &memory_used, &memory_total, &power, &temperature, &ecc,
      &last_xid;
  Counter& xid;
  int64_t xid_seen = 0;
  std::chrono::steady_clock::time_point last{};
  bool sampled = false;
};

TrainingMetrics::TrainingMetrics(Registry& r, TrainingMetricsOptions o)
    : options_(o),
      step_duration_(r.histogram("meshtrain_step_duration_seconds",
                                 "Wall time of one training step.", latency_buckets())),
      steps_(r.counter("meshtrain_steps_total", "Training steps completed (including skipped).")),
      skipped_(r.counter("meshtrain_skipped_steps_total",
                         "Steps whose update was skipped (non-finite loss or gradient).")),
      step_(r.gauge("meshtrain_step", "The last completed step.")),
      samples_(r.counter("meshtrain_samples_total", "Sequences trained on, all ranks.")),
      tokens_(r.counter("meshtrain_tokens_total", "Tokens trained on, all ranks.")),
      samples_per_s_(
          r.gauge("meshtrain_samples_per_second", "Global samples per second, last step.")),
      tokens_per_s_(r.gauge("meshtrain_tokens_per_second", "Global tokens per second, last step.")),
      flops_per_s_(r.gauge("meshtrain_model_flops_per_second",
                           "Model FLOP/s achieved by this rank (6N + attention per token).")),
      loss_(r.gauge("meshtrain_loss", "Training loss of the last step.")),
      val_loss_(r.gauge("meshtrain_val_loss", "Validation loss of the last evaluation.")),
      lr_(r.gauge("meshtrain_learning_rate", "Learning rate of the last step.")),
      grad_norm_(r.gauge("meshtrain_grad_norm", "Global gradient L2 norm before clipping.")),
      loss_scale_(r.gauge("meshtrain_loss_scale", "Loss scale (1 without mixed precision).")),
      rss_(r.gauge("meshtrain_rss_bytes", "Resident memory of this rank at the last step.")),
      eval_duration_(r.histogram("meshtrain_eval_duration_seconds", "Wall time of an evaluation.",
                                 latency_buckets())),
      ckpt_duration_(r.histogram("meshtrain_checkpoint_duration_seconds",
                                 "Wall time of writing a checkpoint.", latency_buckets())),
      ckpt_bytes_(r.counter("meshtrain_checkpoint_bytes_total", "Checkpoint bytes written.")),
      ckpt_ok_(r.counter("meshtrain_checkpoints_total", "Checkpoints attempted, by outcome.",
                         {{"outcome", "success"}})),
      ckpt_failed_(r.counter("meshtrain_checkpoints_total", "Checkpoints attempted, by outcome.",
                             {{"outcome", "failure"}})),
      straggler_rank_(r.gauge("meshtrain_straggler_rank", "The slowest rank of the last step.")),
      straggler_lag_(r.gauge("meshtrain_straggler_lag_seconds",
                             "How far the slowest rank's step trailed the median rank's.")) {
  for (size_t i = 0; i < kNumPhases; ++i) {
    const Labels l{{"phase", std::string(phase_name(static_cast<Phase>(i)))}};
    phase_last_[i] = &r.gauge("meshtrain_step_phase_seconds",
                              "Time of the last step spent per phase (comm = exposed, not "
                              "overlapped with backward).",
                              l);
    phase_total_[i] =
        &r.counter("meshtrain_step_phase_seconds_total", "Time spent per step phase.", l);
  }
  if (o.peak_flops > 0)
    mfu_ = &r.gauge("meshtrain_model_flops_utilization_ratio",
                    "Model FLOPs utilisation: achieved model FLOP/s over the configured peak.");
  r.gauge("meshtrain_world_size", "Ranks in the job.").set(o.world_size);
  r.gauge("meshtrain_restarts", "Times the job was restarted (TORCHELASTIC_RESTART_COUNT).")
      .set(o.restart_count);
  loss_scale_.set(1.0);
  val_loss_.set(std::nan(""));
  if (o.gpu_index >= 0) {
    auto telemetry = std::make_unique<GpuTelemetry>(o.gpu_index, o.nvml_library);
    if (telemetry->available()) {
      gpu_ = std::make_unique<Gpu>(r, std::move(telemetry));
    } else {
      gpu_off_reason_ = telemetry->unavailable_reason();
    }
  }
}

TrainingMetrics::~TrainingMetrics() = default;

void TrainingMetrics::sample_gpu(nlohmann::json& row) {
  if (!gpu_) return;
  Gpu& g = *gpu_;
  // NVML's utilisation covers its own sample period (about a second): sampling every step of a
  // fast run would cost time and say nothing new.
  const auto now = std::chrono::steady_clock::now();
  if (g.sampled && now - g.last < std::chrono::seconds(1)) return;
  g.sampled = true;
  g.last = now;
  const GpuSample s = g.telemetry->sample();
  g.utilization.set(s.utilization);
  g.memory_utilization.set(s.memory_utilization);
  g.memory_used.set(static_cast<double>(s.memory_used_bytes));
  g.memory_total.set(static_cast<double>(s.memory_total_bytes));
  g.power.set(s.power_watts);
  g.temperature.set(s.temperature_celsius);
  g.ecc.set(static_cast<double>(s.ecc_uncorrected));
  g.last_xid.set(static_cast<double>(s.last_xid));
  if (s.xid_events > g.xid_seen) {
    g.xid.inc(static_cast<double>(s.xid_events - g.xid_seen));
    g.xid_seen = s.xid_events;
  }
  row["gpu_util"] = s.utilization;
  row["gpu_mem_used_bytes"] = s.memory_used_bytes;
  row["gpu_power_w"] = s.power_watts;
  row["gpu_temp_c"] = s.temperature_celsius;
  row["gpu_ecc_uncorrected"] = s.ecc_uncorrected;
  row["gpu_xid_events"] = s.xid_events;
}

void TrainingMetrics::on_step(const StepStats& s, const PhaseClock& phases, nlohmann::json& row) {
  step_duration_.observe(s.step_s);
  static constexpr const char* kRowKeys[kNumPhases] = {"data_s", "forward_s", "backward_s",
                                                       "comm_s", "optimizer_s"};
  for (size_t i = 0; i < kNumPhases; ++i) {
    const double sec = phases.seconds(static_cast<Phase>(i));
    phase_last_[i]->set(sec);
    phase_total_[i]->inc(sec);
    row[kRowKeys[i]] = sec;
  }
  if (cpu::kernel_timing()) {
    // Forward, backward and the optimizer: the phases where this thread computes (data and
    // exposed communication wait on others).
    cpu::KernelSeconds k{};
    double computing = 0.0;
    for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kOptimizer}) {
      computing += phases.seconds(p);
      for (size_t i = 0; i < cpu::kNumKernelKinds; ++i) k[i] += phases.kernels(p)[i];
    }
    nlohmann::json kernels = nlohmann::json::object();
    double inside = 0.0;
    for (size_t i = 0; i < cpu::kNumKernelKinds; ++i) {
      kernels[cpu::kernel_kind_name(static_cast<cpu::KernelKind>(i))] = k[i];
      inside += k[i];
    }
    row["kernel_s"] = kernels;
    row["outside_kernels_s"] = std::max(0.0, computing - inside);
  }
  steps_.inc();
  if (s.skipped) skipped_.inc();
  step_.set(static_cast<double>(s.step));
  samples_.inc(options_.samples_per_step);
  tokens_.inc(options_.tokens_per_step);
  loss_.set(s.loss);
  lr_.set(s.lr);
  grad_norm_.set(s.grad_norm);
  loss_scale_.set(s.loss_scale);
  const int64_t rss = process_rss_bytes();
  rss_.set(static_cast<double>(rss));
  row["rss_bytes"] = rss;
  sample_gpu(row);
  if (s.step_s > 0) {
    const double sps = options_.samples_per_step / s.step_s;
    samples_per_s_.set(sps);
    tokens_per_s_.set(options_.tokens_per_step / s.step_s);
    row["samples_per_s"] = sps;
    if (options_.flops_per_token > 0) {
      const double per_rank_tokens =
          options_.tokens_per_step / static_cast<double>(std::max(1, options_.world_size));
      const double fps = options_.flops_per_token * per_rank_tokens / s.step_s;
      flops_per_s_.set(fps);
      row["model_flops_per_s"] = fps;
      if (mfu_ != nullptr) {
        mfu_->set(fps / options_.peak_flops);
        row["mfu"] = fps / options_.peak_flops;
      }
    }
  }
  if (row.contains("val_loss") && row["val_loss"].is_number())
    val_loss_.set(row["val_loss"].get<double>());
}

void TrainingMetrics::on_eval(double val_loss, double seconds) {
  val_loss_.set(val_loss);
  eval_duration_.observe(seconds);
}

void TrainingMetrics::on_checkpoint(double seconds, int64_t bytes, bool ok) {
  ckpt_duration_.observe(seconds);
  if (ok) {
    ckpt_ok_.inc();
    ckpt_bytes_.inc(static_cast<double>(bytes));
  } else {
    ckpt_failed_.inc();
  }
}

TrainingMetrics::Straggler TrainingMetrics::on_rank_step_times(const std::vector<double>& step_s) {
  if (step_s.empty()) return {};
  const auto slowest = std::max_element(step_s.begin(), step_s.end());
  std::vector<double> sorted = step_s;
  const auto mid = sorted.begin() + static_cast<long>((sorted.size() - 1) / 2);
  std::nth_element(sorted.begin(), mid, sorted.end());
  const Straggler s{static_cast<int>(slowest - step_s.begin()), *slowest - *mid};
  straggler_rank_.set(static_cast<double>(s.rank));
  straggler_lag_.set(s.lag_s);
  return s;
}

}  // namespace meshtrain::obs
